"""Unit tests of suite.py's parsing, runnable without a GPU or PyTorch:
python3 -m unittest discover -s vmtest/gpu -p 'suite_test.py'
(vmtest's TestGPUSuiteParsing runs them in `make test`)."""
import unittest

import suite

# What `python -m torch.cuda._memory_viz stats` prints (segsum in
# torch/cuda/_memory_viz.py): a line per segment of 20 MiB or more, the
# totals, then a legend.
STATS = """Summary of segments >= 20.0MiB in size
[aaaa   ] 140.0MiB allocated, 60.0MiB free (0.0% internal)
segments: 7
total_reserved: 182.0MiB
total_allocated: 121.5MiB
total_free: 60.5MiB (0.8% internal)

Legend:
    [a     ] - a segment in the allocator
     ^-- a page 20.0MiB of memory in the segment
"""


class Totals(unittest.TestCase):
    def test_summary_lines(self):
        self.assertEqual(suite.totals(STATS), {"segments": "7", "total_reserved": "182.0MiB",
                                               "total_allocated": "121.5MiB", "total_free": "60.5MiB (0.8% internal)"})

    def test_other_format_reads_nothing(self):
        # A format that changed must show as missing keys, not as two
        # empty, equal dicts.
        self.assertEqual(suite.totals("Total Reserved: 1.2GiB\nsegments=3\n"), {})

    def test_rfc3339(self):
        self.assertEqual(suite.rfc3339_ns("1970-01-01T00:00:01.5Z"), 1_500_000_000)
        self.assertEqual(suite.rfc3339_ns("2026-11-23T05:55:59.864908676Z") % 10**9, 864908676)
        self.assertEqual(suite.rfc3339_ns("1970-01-01T01:00:00+01:00"), 0)


if __name__ == "__main__":
    unittest.main()

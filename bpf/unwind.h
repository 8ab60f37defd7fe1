// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Unwinding in BPF: an allocation's native stack from the call-frame rules
// user space reduced each mapped file's .eh_frame (or .debug_frame) to
// (unwind.Compact, loaded by loader/unwind.go), reading of the process's
// memory only the words each frame needs (its return address and, where
// saved, its frame pointer) instead of copying a window of its stack.
// Where the rules run out (an address in no mapping with rules loaded: a
// library mapped a moment ago whose table is still being made, JIT code,
// the vDSO; a rule not followed here: a signal frame, a DWARF
// expression; memory that cannot be read; a frame that does not climb the
// stack) the record falls back to the frame-pointer walk and the window
// copy for user space to unwind (stack.h), counted by why. A stack is
// thus the user-space unwinder's, frame for frame, either way: each step
// here is unwind.Unwinder's step (unwind/unwind.go) on the same rules.
// Part of cudatrace.bpf.c, the one program file, which includes it.
#ifndef CT_UNWIND_H
#define CT_UNWIND_H

// uw_mode, set from Go before load: CT_UW_OFF copies the window as before;
// CT_UW_ON unwinds here and copies the window only where that falls back;
// CT_UW_BOTH unwinds here and copies the window as well
// (--keep-stack-windows, and the check that both give the same stacks).
#define CT_UW_OFF 0
#define CT_UW_ON 1
#define CT_UW_BOTH 2
const volatile __u8 uw_mode = 0;

// Every file's rows, a range each (struct ct_uw_map's first, nrows); its
// size is set from Go, which writes the rows through a memory mapping of
// it.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1); // overridden from Go
	__type(key, __u32);
	__type(value, struct ct_uw_row);
} uw_rows SEC(".maps");

// Every file's index of its rows (unwind.RowIndex, struct ct_uw_map): a
// file's room here is its rows' in uw_rows, the same size; written from
// Go through a memory mapping, as the rows.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1); // overridden from Go: uw_rows' size
	__type(key, __u32);
	__type(value, struct ct_uw_bucket);
} uw_index SEC(".maps");

// Each traced process's mappings with rules, written whole by the reader
// when it learns of a mapping or a table (an update replaces the entry at
// once: a program sees the old or the new). Dropped at the process's end
// (exit.h forget_process, and loader Tracer.Forget). Allocated as used.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096); // overridden from Go
	__type(key, __u32);        // tgid
	__type(value, struct ct_uw_proc);
} uw_procs SEC(".maps");

// What one step of an unwind knows of the frame it is in: the registers
// the rules use, as unwind.Unwinder's state does. back is 1 where pc is a
// return address (the call it returns from is the byte before: that
// byte's row holds while the callee runs), 0 at a probe inside a function.
// map is the mapping the last frame was found in, plus one (0: none yet):
// the next frame is mostly in the same file, and the search of the
// process's mappings is skipped where it is.
// fp_w says where fp came from, for the memo (uw_memo): 0, the register
// at the start; k, the memo's word k - 1.
struct uw_state {
	__u64 pc;
	__u64 sp;
	__u64 fp;
	__u64 lr;
	__u64 ra_mask; // arm64: the return addresses' PAC bits off (arch.h)
	__u32 fp_ok;
	__u32 lr_ok;
	__u32 back;
	__u32 map;
	__u32 fp_w;
	__u32 pad;
};

// The stack's words an unwind reads: a page at a time while it unwinds
// (from the first word it wants up to the end of that word's page: a read
// that ends at a page's end never faults where the word's page is mapped),
// and, where a memo holds (below), its spans: one read of the process's
// memory for many frames' words, where one read a word cost about as much
// as the window's copy (bpf_probe_read_user of 8 bytes ~110 ns on the VMs
// here, of 4 KiB ~160 ns). A CPU's, numbered (seq) by each unwind, so that
// one preempted by another on the CPU (6.0 on) sees it and falls back
// rather than take another's words.
struct uw_scratch {
	__u64 seq;
	__u64 base; // the address of buf[0]
	__u32 len;  // bytes of buf read
	__u32 pad;
	__u8 buf[2 * CT_PAGE + 8]; // a span (CT_UW_SPAN_MAX); 8 more: uw_load's masked offset, and its word
};
CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, uw_scratch, __u32, struct uw_scratch, 1);

// The most bytes one read of the stack takes into uw_scratch.
#define CT_UW_SPAN_MAX (2 * CT_PAGE)

// uw_load gives out the word at offset off of what s holds (off + 8 at
// most s->len: the caller checked).
static __always_inline int uw_load(struct uw_scratch *s, __u64 off, __u64 *out)
{
	if (off > CT_UW_SPAN_MAX - 8)
		return 0;
	// Masked too (a no-op here), where the pointer is made: the
	// compiler may keep off on the stack between the check and its use,
	// and 6.1's verifier loses the check's bound there ("math between
	// mem pointer and register with unbounded min value").
	barrier_var(off);
	*out = *(__u64 *)(s->buf + (off & (CT_UW_SPAN_MAX - 1)));
	return 1;
}

// uw_read_page reads the stack from addr to its page's end into s, and
// the word at addr into out, and says whether it could.
static __always_inline int uw_read_page(struct uw_scratch *s, __u64 addr, __u64 *out)
{
	__u32 n = CT_PAGE - (__u32)(addr & (CT_PAGE - 1)); // to the page's end: 1..CT_PAGE
	if (n < 8)
		return bpf_probe_read_user(out, 8, (void *)addr) == 0;
	s->len = 0;
	if (bpf_probe_read_user(s->buf, n, (void *)addr))
		return 0;
	s->base = addr;
	s->len = n;
	return uw_load(s, 0, out);
}

// uw_read reads the word at addr of the stack into out through s, and
// says whether it could: from what s holds, else its page is read, from
// addr to the page's end.
static __always_inline int uw_read(struct uw_scratch *s, __u64 addr, __u64 *out)
{
	__u64 off = addr - s->base;
	if (addr < s->base || off + 8 > s->len)
		return uw_read_page(s, addr, out);
	return uw_load(s, off, out);
}

// The memo: a stack unwound here, kept by where its unwind started (the
// process, pc and sp) with every word of the stack the unwind read that
// its answer depends on. An unwind is a function of its start registers,
// the rules (fixed for a process's mappings: ct_uw_proc.gen) and those
// words; so where the registers it used, the mappings' gen and every
// word are found the same, the frames are the same, and are taken from
// the memo without a step: the same stack a training loop's allocation
// site makes again and again costs the reads of its words instead of a
// row search a frame. Never a guess: a word changed, and the stack is
// unwound again.
//
// A word is kept with its address, whose low bits (a stack word is
// 8-byte aligned; a rule that reads another goes without the memo) say
// what it was: a return address (CT_UW_W_RA), whose value is the next
// frame, or a saved frame pointer a later rule took its CFA from
// (CT_UW_W_FP). While the unwind runs, every saved frame pointer is kept
// unmarked, as a later rule may take it; the memo keeps only the marked
// words (ct_uw_pack): in code without frame pointers, where the register
// holds data, most are not, and a hit checks half the words. The frames
// are made again from the return addresses, so that the words checked
// are the frames given.
//
// The words' addresses are gathered into spans (uw_span_add), each up to
// CT_UW_SPAN_MAX bytes: a hit reads a span's bytes at once, those and no
// more (uw_fill). Reading from a word to its page's end, and on to the
// next page's, copied up to 8 KiB an event, and a third read for a frame
// far up the stack: the copies, not the steps, were most of a hit's cost
// (docs/benchmarks.md). A word no span holds is read with its page.
#define CT_UW_W_RA 1
#define CT_UW_W_FP 2
#define CT_UW_W_KIND 3
#define CT_UW_MEMO_WORDS 256 // of a stack's, a power of two: one that reads more goes without the memo
#define CT_UW_CHUNK 16       // words a call of ct_uw_pack or ct_uw_hit_words takes
#define CT_UW_SPANS 8        // a power of two
#define CT_UW_M_FP 1         // a rule used the frame pointer the unwind started with (uw_memo.fp)
#define CT_UW_M_LR 2         // a rule used the link register it started with (uw_memo.lr)
#define CT_UW_M_NO 4         // not kept: too many words, or one not aligned
_Static_assert(CT_UW_MEMO_WORDS % CT_UW_CHUNK == 0, "chunks cover the words");

struct uw_memo_key {
	__u32 tgid;
	__u32 entry; // uw_stack's: whether the probe sits inside a function
	__u64 pc;
	__u64 sp;
};

struct uw_word {
	__u64 addr; // | CT_UW_W_*
	__u64 val;
};

// A stretch of the stack a hit reads at once: it decides only what is
// read, not what a word is found to hold, and is not summed.
struct uw_span {
	__u64 lo;
	__u32 len; // 8..CT_UW_SPAN_MAX
	__u32 pad;
};

struct uw_memo {
	// A hash of all that follows but the spans, up to the words in use
	// (uw_sum_head, then the words'): an array slot is written in place,
	// even while another CPU reads it, and a copy torn so fails it.
	__u64 sum;
	struct uw_memo_key key; // the entry's own: an element reused for another key fails it
	__u64 gen;              // the process's mappings' (ct_uw_proc.gen)
	__u64 fp;
	__u64 lr;
	__u32 n;  // frames
	__u32 nw; // words
	__u32 flags;
	__u32 nspan;
	struct uw_span span[CT_UW_SPANS];
	struct uw_word w[CT_UW_MEMO_WORDS];
};

// Direct-mapped: a memo's slot is a hash of its key (uw_slot), and a
// memo made for another key in the same slot takes its place. An array's
// look-up is a few instructions where the LRU hash's it replaced cost a
// hash of the key, a bucket's walk and the LRU's own bookkeeping at every
// hit (and its update a list's at every miss). What a slot holds of a
// process is worth nothing once its mappings' gen moved on; not emptied
// at a process's end: BPF cannot list a process's keys, and a later
// process with its PID has another gen. Slots are written in place, not
// atomically: a memo read while another CPU writes its slot fails its
// key or its sum, and the stack is unwound.
#define CT_UW_MEMO_SLOTS 1024 // a power of two
CT_MAP(BPF_MAP_TYPE_ARRAY, uw_memo, __u32, struct uw_memo, CT_UW_MEMO_SLOTS);

// A CPU's memo being made by an unwind (ct_uw_step writes its words), or
// the head of one copied out of uw_memo to be checked; and the frames
// made from it.
// Covered by the CPU's uw_scratch seq, as the pages are: an unwind that
// preempted another on the CPU counts it up, and the first then falls
// back.
struct uw_memo_buf {
	struct uw_memo m;
	__u64 pcs[CT_MAX_FRAMES + 1];
	// ct_uw_hit_words' count of frames made, and whether the stack
	// ended: kept here, not in registers, so that the verifier knows no
	// number of them and checks a word's step once, not once for each
	// count it could have reached there.
	__u32 n;
	__u32 ended;
	// The place the unwind starts (the key looked up and kept) and a
	// word read: here, not on the BPF stack, which the return programs
	// use nearly all of with the global functions they call (Linux 6.1
	// counts a caller's and its callee's together, 512 bytes at most),
	// and which is the only other memory 6.1 takes a map key from.
	struct uw_memo_key k;
	__u32 slot; // k's in uw_memo (uw_slot)
	__u32 j;    // ct_uw_pack's: the words kept so far
	__u32 cur;  // uw_fill's: the memo's next span to read
	__u32 pad2;
	// The process's mappings' gen (ct_uw_proc.gen) where the unwind
	// started: here, not in a register the return programs' frames
	// would keep (TestStackChains).
	__u64 gen;
	__u64 v; // the word read (uw_read_memo)
	__u64 hw; // the words' hash so far (ct_uw_pack, ct_uw_hit_words)
	// ct_uw_hit_words' word under check (its address and kind, its value)
	// and the return addresses' mask (uw_state.ra_mask).
	__u64 a;
	__u64 want;
	__u64 ra_mask;
};
_Static_assert(((CT_MAX_FRAMES + 1) & CT_MAX_FRAMES) == 0, "CT_MAX_FRAMES masks an index of pcs");
CT_MAP(BPF_MAP_TYPE_PERCPU_ARRAY, uw_memo_buf, __u32, struct uw_memo_buf, 1);

// uw_keep_word adds the word at addr (val) to the memo being made, kind
// a CT_UW_W_* (0: a saved frame pointer, marked later where a rule takes
// it), and returns its number plus one (0: not kept, the memo given up).
static __always_inline __u32 uw_keep_word(struct uw_memo *m, __u64 addr, __u64 val, __u32 kind)
{
	__u32 i = m->nw;
	if ((addr & CT_UW_W_KIND) || i >= CT_UW_MEMO_WORDS - 1) { // (the last unused: ct_uw_hit_words' bound)
		m->flags |= CT_UW_M_NO;
		return 0;
	}
	m->w[i & (CT_UW_MEMO_WORDS - 1)].addr = addr | kind;
	m->w[i & (CT_UW_MEMO_WORDS - 1)].val = val;
	m->nw = i + 1;
	return i + 1;
}

// ct_uw_step's answers.
#define CT_UW_FRAME 0  // st is the caller's frame now: st->pc its return address
#define CT_UW_END 1    // the stack ends in this frame
#define CT_UW_NOMAP 2  // st->pc is in no mapping with rules: fall back
#define CT_UW_RULE 3   // a rule not followed, or memory not read: fall back

// Search steps: a process's mappings (CT_UW_MAPS), a bucket's rows (up
// to a file's 2^22).
#define CT_UW_MAP_STEPS 10
#define CT_UW_ROW_STEPS 23
#define CT_UW_MAX_ROWS (1u << 22)

// ct_uw_step unwinds one frame: st is the frame's state, pm the process's
// mappings; the words it reads go to mb, the memo being made (NULL:
// none). A global function: the verifier checks it once, not at each
// of a stack's frames. What a frame costs is mostly finding its row: the
// mapping (the last frame's where pc is still in it), the bucket of the
// file's index, the row among the bucket's few.
__noinline int ct_uw_step(struct uw_state *st, struct ct_uw_proc *pm, struct uw_scratch *s, struct uw_memo *mb)
{
	if (!st || !pm || !s)
		return CT_UW_NOMAP;
	__u64 pc = st->pc;
	struct ct_uw_map *m = &pm->maps[(st->map - 1) & (CT_UW_MAPS - 1)];
	if (!st->map || pc < m->start || pc >= m->end) {
		// The mapping: the last starting at or below pc. The bounds
		// stay numbers the verifier knows only a range of (never
		// clamped to a constant): with constants it follows every
		// path of the search apart, and with ranges it finds them
		// the same.
		__u32 lo = 0, hi = pm->n;
		if (hi > CT_UW_MAPS)
			return CT_UW_NOMAP;
		for (int i = 0; i < CT_UW_MAP_STEPS && lo < hi; i++) {
			__u32 mid = (lo + hi) / 2;
			if (pm->maps[mid & (CT_UW_MAPS - 1)].start <= pc)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo == 0 || lo != hi || lo > CT_UW_MAPS)
			return CT_UW_NOMAP;
		m = &pm->maps[(lo - 1) & (CT_UW_MAPS - 1)];
		if (pc >= m->end)
			return CT_UW_NOMAP;
		st->map = lo;
	}
	__u32 first = m->first, nrows = m->nrows;
	if (!nrows || nrows > CT_UW_MAX_ROWS)
		return CT_UW_NOMAP;
	__u64 v = pc - m->bias - st->back;
	if (v >> 32 || (__u32)v < m->base)
		return CT_UW_NOMAP;
	// The row: the last of the file's at or below v, one of its
	// bucket's (past the last bucket, the file's last).
	__u32 at = first + nrows - 1;
	__u32 b = ((__u32)v - m->base) >> (m->shift & 31);
	if (b < m->nbuckets) {
		__u32 k = first + b;
		struct ct_uw_bucket *x = bpf_map_lookup_elem(&uw_index, &k);
		if (!x)
			return CT_UW_RULE;
		// The first above v of the rows after the one holding at
		// the bucket's start, up to the one holding at the next's.
		__u32 lo = first + x->lo + 1, hi = first + x->hi + 1;
		if (lo > hi || hi > first + nrows)
			return CT_UW_RULE;
		for (int i = 0; i < CT_UW_ROW_STEPS && lo < hi; i++) {
			__u32 mid = lo + (hi - lo) / 2;
			struct ct_uw_row *r = bpf_map_lookup_elem(&uw_rows, &mid);
			if (!r)
				return CT_UW_RULE;
			if (r->pc <= (__u32)v)
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo != hi)
			return CT_UW_RULE;
		at = lo - 1;
	}
	struct ct_uw_row *r = bpf_map_lookup_elem(&uw_rows, &at);
	if (!r)
		return CT_UW_RULE;

	__u64 cfa;
	switch (r->cfa) {
	case CT_UW_CFA_SP:
		cfa = st->sp + (__s64)r->cfa_off;
		break;
	case CT_UW_CFA_FP:
		if (!st->fp_ok)
			return CT_UW_RULE;
		cfa = st->fp + (__s64)r->cfa_off;
		if (mb) { // the frame pointer this frame's CFA took is checked
			if (st->fp_w == 0)
				mb->flags |= CT_UW_M_FP;
			else
				mb->w[(st->fp_w - 1) & (CT_UW_MEMO_WORDS - 1)].addr |= CT_UW_W_FP;
		}
		break;
	default:
		return CT_UW_RULE;
	}
	if (r->ra == CT_UW_REG_UNDEF)
		return CT_UW_END;

	// The return address, and the frame pointer where this frame saved
	// it.
	__u64 ra = 0, fp = st->fp;
	__u32 fp_ok = st->fp_ok, fp_w = st->fp_w;
	if (r->ra == CT_UW_REG_OFFSET) {
		__u64 at = cfa + (__s64)r->ra_off;
		if (!uw_read(s, at, &ra))
			return CT_UW_RULE;
		if (mb)
			uw_keep_word(mb, at, ra, CT_UW_W_RA);
	} else if (r->ra == CT_UW_REG_LR) {
		if (!st->lr_ok)
			return CT_UW_RULE;
		ra = st->lr;
		if (mb)
			mb->flags |= CT_UW_M_LR;
	} else {
		return CT_UW_RULE;
	}
	ra &= st->ra_mask;
	if (ra == 0)
		return CT_UW_END;
	// The CFA climbs the stack; only a frame whose return address is
	// still in the link register may have it at the stack pointer.
	if (cfa < st->sp || (cfa == st->sp && r->ra != CT_UW_REG_LR))
		return CT_UW_RULE;
	switch (r->fp) {
	case CT_UW_REG_SAME:
		break;
	case CT_UW_REG_UNDEF:
		fp_ok = 0;
		break;
	case CT_UW_REG_OFFSET: {
		__u64 at = cfa + (__s64)r->fp_off;
		fp_ok = uw_read(s, at, &fp);
		// kept unmarked: checked only where a later CFA takes it
		if (fp_ok && mb)
			fp_w = uw_keep_word(mb, at, fp, 0);
		break;
	}
	default:
		return CT_UW_RULE;
	}
	st->pc = ra;
	st->sp = cfa;
	st->fp = fp;
	st->fp_ok = fp_ok;
	st->fp_w = fp_w;
	st->lr_ok = 0;
	st->back = 1;
	return CT_UW_FRAME;
}

// uw_mix folds x into the hash h.
static __always_inline __u64 uw_mix(__u64 h, __u64 x)
{
	h = (h ^ x) * 0x9e3779b97f4a7c15ULL;
	return h ^ (h >> 29);
}

// uw_slot is key k's slot in uw_memo.
static __always_inline __u32 uw_slot(struct uw_memo_key *k)
{
	__u64 h = uw_mix(uw_mix(uw_mix(0, k->tgid | (__u64)k->entry << 32), k->pc), k->sp);
	return (__u32)(h >> 32) & (CT_UW_MEMO_SLOTS - 1);
}

// uw_sum is the memo m's sum: its head (all before its spans but the sum
// itself), then hw, its words' hash (ct_uw_pack, ct_uw_hit_words).
static __always_inline __u64 uw_sum(struct uw_memo *m, __u64 hw)
{
	__u64 h = uw_mix(0, m->key.tgid | (__u64)m->key.entry << 32);
	h = uw_mix(h, m->key.pc);
	h = uw_mix(h, m->key.sp);
	h = uw_mix(h, m->gen);
	h = uw_mix(h, m->fp);
	h = uw_mix(h, m->lr);
	h = uw_mix(h, m->n | (__u64)m->nw << 32);
	h = uw_mix(h, m->flags);
	return uw_mix(h, hw);
}

// uw_span_add puts the word at addr in the memo m's spans: in its last
// span where that stays within CT_UW_SPAN_MAX bytes, else in a new one
// (none past CT_UW_SPANS: a hit reads that word with its page).
static __always_inline void uw_span_add(struct uw_memo *m, __u64 addr)
{
	__u32 n = m->nspan;
	if (n > CT_UW_SPANS)
		return;
	if (n) {
		struct uw_span *p = &m->span[(n - 1) & (CT_UW_SPANS - 1)];
		__u64 lo = p->lo, hi = lo + p->len;
		if (addr >= lo && addr + 8 - lo <= CT_UW_SPAN_MAX) {
			if (addr + 8 > hi)
				p->len = addr + 8 - lo;
			return;
		}
		if (addr < lo && hi - addr <= CT_UW_SPAN_MAX) {
			p->lo = addr;
			p->len = hi - addr;
			return;
		}
		if (n == CT_UW_SPANS)
			return;
	}
	struct uw_span *p = &m->span[n & (CT_UW_SPANS - 1)];
	p->lo = addr;
	p->len = 8;
	m->nspan = n + 1;
}

// ct_uw_pack moves the marked words of the CPU's memo being made, from
// word i0 on (CT_UW_CHUNK of them), down to its next free place
// (uw_memo_buf.j), hashes them (hw) and puts them in spans. A global
// function, called a chunk at a time: the verifier checks a chunk's loop
// once, not all CT_UW_MEMO_WORDS words' (their loops were a third of
// what it checked of ct_exit).
__noinline int ct_uw_pack(__u32 i0)
{
	__u32 zero = 0;
	struct uw_memo_buf *b = bpf_map_lookup_elem(&uw_memo_buf, &zero);
	if (!b)
		return 0;
	struct uw_memo *m = &b->m;
	__u32 nw = m->nw;
	__u64 hw = b->hw;
	for (int k = 0; k < CT_UW_CHUNK; k++) {
		__u32 i = i0 + k;
		if (i >= nw)
			break;
		__u64 a = m->w[i & (CT_UW_MEMO_WORDS - 1)].addr;
		__u64 val = m->w[i & (CT_UW_MEMO_WORDS - 1)].val;
		if (!(a & CT_UW_W_KIND))
			continue;
		// j from memory, not a register: a register's number, one
		// more on each word kept, made every count of words kept a
		// path of its own for the verifier.
		__u32 j = *(volatile __u32 *)&b->j;
		m->w[j & (CT_UW_MEMO_WORDS - 1)].addr = a;
		m->w[j & (CT_UW_MEMO_WORDS - 1)].val = val;
		b->j = j + 1;
		hw = uw_mix(uw_mix(hw, a), val);
		uw_span_add(m, a & ~(__u64)CT_UW_W_KIND);
	}
	b->hw = hw;
	return 1;
}

// uw_fill reads into s the next span of the memo under check, e (its
// slot in uw_memo; b, the CPU's uw_memo_buf, whose cur says which span is
// next), where it holds the word at addr, and says whether it did. A
// memo's words climb the stack, and its spans with them: a word that is
// not in the next span (a frame pointer saved above another frame's
// words) is read with its page (uw_read_page), and so is every word of a span
// whose read failed (a page among its words not present: no read here
// faults one in). The span is read in place: a torn one only reads
// other bytes, which the words then fail.
static __always_inline int uw_fill(struct uw_memo_buf *b, struct uw_memo *e, struct uw_scratch *s, __u64 addr)
{
	__u32 i = b->cur;
	if (i >= b->m.nspan || i >= CT_UW_SPANS)
		return 0;
	__u64 lo = *(volatile __u64 *)&e->span[i & (CT_UW_SPANS - 1)].lo;
	__u32 len = *(volatile __u32 *)&e->span[i & (CT_UW_SPANS - 1)].len;
	if (addr < lo || addr + 8 > lo + len || len > CT_UW_SPAN_MAX)
		return 0;
	b->cur = i + 1;
	barrier_var(len);
	len = ((len - 1) & (CT_UW_SPAN_MAX - 1)) + 1; // a no-op that shows the verifier 1..CT_UW_SPAN_MAX
	s->len = 0;
	if (bpf_probe_read_user(s->buf, len, (void *)lo))
		return 0;
	s->base = lo;
	s->len = len;
	return 1;
}

// uw_read_memo reads the word at addr of the stack into b->v for a check
// of the memo e, and says whether it could: from what s holds, else from
// the memo's next span (uw_fill), else with its page.
static __always_inline int uw_read_memo(struct uw_memo_buf *b, struct uw_memo *e, struct uw_scratch *s, __u64 addr)
{
	__u64 off = addr - s->base;
	if (addr < s->base || off + 8 > s->len) {
		if (!uw_fill(b, e, s, addr))
			return uw_read_page(s, addr, &b->v);
		off = addr - s->base; // the span holds it: uw_fill checked
	}
	return uw_load(s, off, &b->v);
}

// ct_uw_hit_words checks words i0 on (CT_UW_CHUNK of them) of the memo
// in the CPU's uw_memo_buf slot against the stack, read through s, and
// makes the frames of their return addresses, as uw_memo_check says. It
// returns 1 where they held, 0 where the memo ends here (too many frames,
// a word not marked: a torn copy), -1 where a word changed. A global
// function, called a chunk at a time (uw_memo_check); it calls none: the
// return programs use nearly all of the BPF stack, and Linux 6.1 counts a
// chain of calls' frames together, 32 bytes at least each, 512 in all.
__noinline int ct_uw_hit_words(struct uw_scratch *s, __u32 i0)
{
	__u32 zero = 0;
	struct uw_memo_buf *b = bpf_map_lookup_elem(&uw_memo_buf, &zero);
	if (!s || !b)
		return 0;
	struct uw_memo *e = bpf_map_lookup_elem(&uw_memo, &b->slot);
	if (!e)
		return 0;
	// What a word needs past the calls that read the stack goes through
	// b, not registers: held in registers, they were spilled to a frame
	// of 112 bytes, which with ct_usdt's took the chain past 512.
	__u64 hw = b->hw;
	for (int k = 0; k < CT_UW_CHUNK; k++) {
		__u32 i = i0 + k;
		if (i >= *(volatile __u32 *)&b->m.nw)
			break;
		__u64 a = *(volatile __u64 *)&e->w[i & (CT_UW_MEMO_WORDS - 1)].addr;
		__u64 val = *(volatile __u64 *)&e->w[i & (CT_UW_MEMO_WORDS - 1)].val;
		hw = uw_mix(uw_mix(hw, a), val);
		b->a = a;
		b->want = val;
		if (!(a & CT_UW_W_KIND))
			return 0;
		if (!uw_read_memo(b, e, s, a & ~(__u64)CT_UW_W_KIND) || b->v != b->want)
			return -1;
		if (!(b->a & CT_UW_W_RA))
			continue;
		__u64 v = b->want & b->ra_mask;
		__u32 n = *(volatile __u32 *)&b->n;
		if (*(volatile __u32 *)&b->ended || n >= CT_MAX_FRAMES)
			return 0;
		if (!v) { // the stack's end
			b->ended = 1;
			continue;
		}
		b->pcs[n & CT_MAX_FRAMES] = v; // (n < CT_MAX_FRAMES, a power of two less one)
		b->n = n + 1;
	}
	b->hw = hw;
	return 1;
}

// uw_copy_head copies the memo e's head (all before its spans) to m:
// loads and stores, where bpf_probe_read_kernel's fixed cost was more
// than the copy's.
static __always_inline void uw_copy_head(struct uw_memo *m, struct uw_memo *e)
{
	m->sum = *(volatile __u64 *)&e->sum;
	m->key.tgid = *(volatile __u32 *)&e->key.tgid;
	m->key.entry = *(volatile __u32 *)&e->key.entry;
	m->key.pc = *(volatile __u64 *)&e->key.pc;
	m->key.sp = *(volatile __u64 *)&e->key.sp;
	m->gen = *(volatile __u64 *)&e->gen;
	m->fp = *(volatile __u64 *)&e->fp;
	m->lr = *(volatile __u64 *)&e->lr;
	m->n = *(volatile __u32 *)&e->n;
	m->nw = *(volatile __u32 *)&e->nw;
	m->flags = *(volatile __u32 *)&e->flags;
	m->nspan = *(volatile __u32 *)&e->nspan;
}
_Static_assert(__builtin_offsetof(struct uw_memo, span) == __builtin_offsetof(struct uw_memo, nspan) + 4, "uw_copy_head copies all of the head");

// ct_uw_memo_head begins the check of the memo for an unwind that starts
// at the CPU's uw_memo_buf k, with its gen (the registers st): it
// copies the memo's head out and checks it, and makes the frames the
// registers give (the interrupted instruction, a return address in the
// link register), into the buffer's pcs. It returns 1 where the memo's
// words are to be checked (uw_memo_check), 0 where there is no memo (or
// one made with other mappings, or a copy torn by its reuse), -1 where a
// register the memo's unwind used changed. A global function, checked
// once.
__noinline int ct_uw_memo_head(struct uw_state *st)
{
	__u32 zero = 0;
	struct uw_memo_buf *b = bpf_map_lookup_elem(&uw_memo_buf, &zero);
	if (!st || !b)
		return 0;
	struct uw_memo *e = bpf_map_lookup_elem(&uw_memo, &b->slot);
	if (!e)
		return 0;
	// Its head copied out (its spans read in place, by uw_fill); its
	// words read in place, each once, and summed as they are read and
	// used (ct_uw_hit_words): a slot another CPU writes meanwhile (a memo
	// of another key, or of this one made again) fails the sum at the
	// end, and nothing read is taken unless it holds. A torn memo may end
	// in -1 (counted unwind_memo_changed) before its sum is checked: then
	// the stack is unwound, as for a changed one.
	struct uw_memo *m = &b->m;
	uw_copy_head(m, e);
	if (m->nw >= CT_UW_MEMO_WORDS || m->nspan > CT_UW_SPANS || m->key.tgid != b->k.tgid ||
	    m->key.entry != b->k.entry || m->key.pc != b->k.pc || m->key.sp != b->k.sp ||
	    m->gen != b->gen) // (gen: made with mappings since changed)
		return 0;
	if ((m->flags & CT_UW_M_FP) && m->fp != st->fp)
		return -1;
	b->pcs[0] = st->pc;
	b->n = 1;
	b->ended = 0;
	b->hw = 0;
	b->cur = 0;
	b->ra_mask = st->ra_mask;
	if (m->flags & CT_UW_M_LR) {
		if (!st->lr_ok || m->lr != st->lr)
			return -1;
		__u64 ra = st->lr & st->ra_mask;
		if (ra) {
			b->pcs[1] = ra;
			b->n = 2;
		} else {
			b->ended = 1;
		}
	}
	return 1;
}

// uw_memo_check makes the frames of an unwind that starts at b's k (the
// CPU's uw_memo_buf, with its gen; the registers st) from its memo,
// into b's pcs, where every register and word the memo's unwind used is
// found the same; it returns their count, 0 where there is no memo (or
// one made with other mappings, or a copy torn by its reuse), -1 where a
// register or word the memo's unwind used changed. Reads through s (the
// CPU's pages: uw_read, the memo's spans: uw_fill). The global functions
// it calls a chunk of words at a time are called from here, not from one
// another: see ct_uw_hit_words.
static __always_inline int uw_memo_check(struct uw_memo_buf *b, struct uw_state *st, struct uw_scratch *s)
{
	int r = ct_uw_memo_head(st);
	if (r <= 0)
		return r;
	for (int c = 0; c < CT_UW_MEMO_WORDS / CT_UW_CHUNK; c++) {
		if (c * CT_UW_CHUNK >= *(volatile __u32 *)&b->m.nw)
			break;
		r = ct_uw_hit_words(s, c * CT_UW_CHUNK);
		if (r <= 0)
			return r;
	}
	__u32 n = *(volatile __u32 *)&b->n;
	if (uw_sum(&b->m, b->hw) != b->m.sum || n != b->m.n || n > CT_MAX_FRAMES)
		return 0;
	return n;
}

// ct_uw_memo_keep keeps the memo made in the CPU's uw_memo_buf (its
// frames counted in m.n), its marked words packed (ct_uw_pack: b->j of
// them, hashed in b->hw), by an unwind that started at its k, with its
// gen; seq is the CPU's uw_scratch count when the unwind began:
// an unwind that preempted this one wrote in the buffer too, and what was
// kept then is made to fail its sum before any other look-up of k (only
// this thread unwinds from its sp).
__noinline int ct_uw_memo_keep(struct uw_scratch *s, __u64 seq)
{
	__u32 zero = 0;
	struct uw_memo_buf *b = bpf_map_lookup_elem(&uw_memo_buf, &zero);
	if (!s || !b)
		return 0;
	struct uw_memo *m = &b->m;
	__u32 nw = b->j;
	if (nw >= CT_UW_MEMO_WORDS)
		return 0;
	m->nw = nw;
	m->key = b->k;
	m->gen = b->gen;
	m->sum = uw_sum(m, b->hw);
	if (*(volatile __u64 *)&s->seq != seq)
		return 0;
	struct uw_memo *e = bpf_map_lookup_elem(&uw_memo, &b->slot);
	if (!e)
		return 0;
	// The head and the words in use, not the whole slot's 4 KiB.
	bpf_probe_read_kernel(e, offsetof(struct uw_memo, w) + (nw & (CT_UW_MEMO_WORDS - 1)) * sizeof(struct uw_word), m);
	barrier();
	if (*(volatile __u64 *)&s->seq != seq) {
		e->sum = ~m->sum; // see above
		return 0;
	}
	return 1;
}

// uw_memo_keep packs the memo made in b (the CPU's uw_memo_buf), a chunk
// of words at a time (ct_uw_pack), and keeps it (ct_uw_memo_keep): seq
// is the unwind's, as there.
static __always_inline void uw_memo_keep(struct uw_memo_buf *b, struct uw_scratch *s, __u64 seq)
{
	if ((b->m.flags & CT_UW_M_NO) || b->m.nw >= CT_UW_MEMO_WORDS)
		return;
	b->j = 0;
	b->hw = 0;
	b->m.nspan = 0;
	for (int c = 0; c < CT_UW_MEMO_WORDS / CT_UW_CHUNK; c++) {
		if (c * CT_UW_CHUNK >= *(volatile __u32 *)&b->m.nw)
			break;
		if (!ct_uw_pack(c * CT_UW_CHUNK))
			return;
	}
	ct_uw_memo_keep(s, seq);
}

// uw_stack unwinds the calling thread's stack into e's frames (the
// interrupted instruction first) and their count, and says whether it
// did; where it fell back (counted), the record takes the frame-pointer
// walk and the window instead. entry says the probe sits inside a
// function (USDT: recorded at entry), whose instruction pointer is no
// return address and whose link register (arm64) still holds its own.
// The count goes to the record, not back in a register: the verifier
// walks the loop frame by frame, and the code after it once per count
// it could leave with took it past its million instructions; read back
// from the record (a number it does not know), the paths join.
static __always_inline int uw_stack(struct pt_regs *ctx, struct ct_alloc_event *e, int entry)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct ct_uw_proc *pm = bpf_map_lookup_elem(&uw_procs, &tgid);
	if (!pm) {
		count(CT_CNT_UW_NOMAP);
		return 0;
	}
	__u32 zero = 0;
	struct uw_scratch *s = bpf_map_lookup_elem(&uw_scratch, &zero);
	if (!s)
		return 0;
	__u64 seq = s->seq + 1;
	s->seq = seq;
	s->len = 0;
	struct uw_state st = {
		.pc = PT_REGS_IP(ctx),
		.sp = PT_REGS_SP(ctx),
		.fp = PT_REGS_FP(ctx),
		.fp_ok = 1,
		.back = entry ? 0 : 1,
		.ra_mask = ct_ra_mask(),
	};
	ct_uw_lr(ctx, entry, &st.lr, &st.lr_ok);
	struct uw_memo_buf *b = bpf_map_lookup_elem(&uw_memo_buf, &zero);
	if (!b)
		return 0;
	b->k.tgid = tgid;
	b->k.entry = entry ? 1 : 0;
	b->k.pc = st.pc;
	b->k.sp = st.sp;
	b->slot = uw_slot(&b->k);
	b->gen = pm->gen;
	__s32 n = uw_memo_check(b, &st, s);
	if (n > 0) {
		bpf_probe_read_kernel(e->stack, (n & CT_MAX_FRAMES) * sizeof(__u64), b->pcs);
		// After the copy: an unwind that preempted this one wrote in b.
		barrier();
		if (*(volatile __u64 *)&s->seq != seq) {
			count(CT_CNT_UW_RULE);
			return 0;
		}
		e->h.nframes = n;
		count(CT_CNT_UW_MEMO);
		count(CT_CNT_UW_BPF);
		return 1;
	}
	if (n < 0)
		count(CT_CNT_UW_MEMO_CHANGED);
	// No memo that holds: unwound, and the words it reads kept.
	b->m.nw = 0;
	b->m.flags = 0;
	b->m.fp = st.fp;
	b->m.lr = st.lr;
	e->stack[0] = st.pc;
	n = 1;
	for (; n < CT_MAX_FRAMES; n++) {
		int r = ct_uw_step(&st, pm, s, &b->m);
		if (r == CT_UW_END)
			break;
		if (r != CT_UW_FRAME) {
			count(r == CT_UW_NOMAP ? CT_CNT_UW_NOMAP : CT_CNT_UW_RULE);
			return 0;
		}
		e->stack[n] = st.pc;
	}
	// Checked after: an unwind that preempted this one counted seq up.
	barrier();
	if (*(volatile __u64 *)&s->seq != seq) {
		count(CT_CNT_UW_RULE);
		return 0;
	}
	e->h.nframes = n;
	// n read back from the record, as the count above: not a register
	// the verifier knows a number of at each of the loop's exits.
	b->m.n = *(volatile __u32 *)&e->h.nframes;
	uw_memo_keep(b, s, seq);
	count(CT_CNT_UW_BPF);
	return 1;
}

#endif

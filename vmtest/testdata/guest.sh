#!/bin/busybox sh
# /init of the kernel matrix's initramfs (vmtest/kernels_test.go): runs
# cudatrace on the booted kernel and sends what it wrote, a gzipped tar in
# base64, over $RESULTS (x86-64: the second serial port; arm64's virt
# machine has one, the console, quiet at loglevel=1); the host test checks
# it against the stand-in's ground truth. Paths come from /vm/env, written
# by the host for the guest's architecture (ARCH); the mode from the
# kernel command line (ct_mode=full|floor, ct_noloop=1, ct_dumps=1).
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
# /tmp stays on the initramfs: the stand-ins sit under /tmp/cudatrace-vmtest-*.
mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf
ip link set lo up
. /vm/env
export HOME=/root LD_LIBRARY_PATH=$LIBPATH FAKECUDA_DEVICES=2 FAKECUDA_MEM_LIMIT=1073741824

mode=full
noloop=0
dumps=0
for a in $(cat /proc/cmdline); do
	case $a in
	ct_mode=*) mode=${a#ct_mode=} ;;
	ct_noloop=1) noloop=1 ;;
	ct_dumps=1) dumps=1 ;;
	esac
done
O=/tmp/out
mkdir -p $O
uname -r >$O/uname
cp /proc/cpuinfo $O/cpuinfo
say() { echo "guest: $(cut -d' ' -f1 /proc/uptime)s $*" >/dev/console; }
say "Linux $(uname -r), mode $mode"

# waitfor FILE TEXT SECONDS: until FILE holds TEXT.
waitfor() {
	i=0
	while ! grep -q "$2" "$1" 2>/dev/null; do
		i=$((i + 1))
		[ $i -gt $(($3 * 10)) ] && return 1
		sleep 0.1
	done
}

# record CASE [record args...]: one `cudatrace record`, its exit code and
# output kept in $O/CASE, the stand-in's log as $O/CASE/fake.log.
record() {
	c=$1
	shift
	mkdir -p $O/$c
	say "case $c"
	FAKECUDA_LOG=$O/$c/fake.log $CT record -o $O/$c/trace "$@" >$O/$c/stdout 2>$O/$c/stderr
	echo $? >$O/$c/rc
}

if [ "$mode" = floor ]; then
	record floor --lib $LIB -- $BIN/mix 1 1 1
else
	# The runtime mix, with the default 16 KiB window; bpftool shows which
	# variant of ct_exit is loaded while it runs, and which kind of links
	# attach the uprobes (uprobe_multi from 6.6, perf_event before).
	record mix16 --lib $LIB -- sh -c "bpftool prog show >$O/mix16/progs.txt; bpftool link show >$O/mix16/links.txt; exec $BIN/mix 4 40 7"
	record mix0 --stack-window 0 --lib $LIB -- $BIN/mix 2 20 7
	record mix64 --stack-window 64KiB --lib $LIB -- $BIN/mix 2 20 7
	record driver --lib $DRV -- $BIN/driver 30
	# Python frames.
	record python --lib $LIB -- $PY $SCRIPT $LIB $THREADS

	# --pid: attach_later waits on a fifo for phase 2.
	mkdir -p $O/attach
	mkfifo /tmp/attach.fifo
	FAKECUDA_LOG=$O/attach/fake.log $BIN/attach_later </tmp/attach.fifo >$O/attach/workload.out 2>&1 &
	wl=$!
	exec 3>/tmp/attach.fifo
	waitfor $O/attach/workload.out ready 60
	say "case attach"
	$CT record --lib $LIB --pid $wl -o $O/attach/trace >$O/attach/stdout 2>$O/attach/stderr &
	rec=$!
	waitfor $O/attach/stderr "cudatrace: attached" 120
	echo go >&3
	exec 3>&-
	wait $wl
	wait $rec
	echo $? >$O/attach/rc

	# The agent's /metrics while hold holds its memory.
	mkdir -p $O/agent
	say "case agent"
	$CT agent --lib $LIB --listen 127.0.0.1:9738 --dump-dir "" --nvml=false >$O/agent/stderr 2>&1 &
	ag=$!
	if waitfor $O/agent/stderr "cudatrace: attached" 120; then
		mkfifo /tmp/hold.fifo
		FAKECUDA_LOG=$O/agent/fake.log $BIN/hold </tmp/hold.fifo >$O/agent/workload.out 2>&1 &
		wl=$!
		exec 4>/tmp/hold.fifo
		waitfor $O/agent/workload.out ready 60
		echo go >&4
		waitfor $O/agent/workload.out held 60
		echo $wl >$O/agent/pid
		cp $O/agent/fake.log $O/agent/held.log
		# The agent reads its ring buffer every 50 ms: give it a moment.
		sleep 2
		wget -q -O $O/agent/metrics.txt http://127.0.0.1:9738/metrics
		echo done >&4
		exec 4>&-
		wait $wl
	fi
	kill -TERM $ag
	wait $ag
	echo $? >$O/agent/rc

	if [ "$ARCH" = arm64 ]; then
		# Native stacks through code without frame pointers whose return
		# addresses are signed (-mbranch-protection=standard): unwound here,
		# from frame pointers alone, and kept for the host to unwind (an
		# arm64 trace read on x86-64).
		record omitfp --lib $LIB -- $OMITFP
		record omitfp0 --stack-window 0 --lib $LIB -- $OMITFP
		record keep --keep-stack-windows --lib $LIB -- $OMITFP
		# PyTorch's tensor-level USDT probes, arm64's operands.
		record tensors --lib $LIB --lib $C10 -- $BIN/tensors 40
		if [ $dumps = 1 ]; then
			# The unwind package's arm64 test stacks (unwind/testdata/arm64).
			mkdir -p $O/dumps
			env -i /unwind/dumpself $O/dumps/dump-$(uname -r | cut -d. -f1-2)
		fi
	fi
	if [ $noloop = 1 ]; then
		export CUDATRACE_TEST_NO_BPF_LOOP=1
		record noloop --lib $LIB -- sh -c "bpftool prog show >$O/noloop/progs.txt; exec $BIN/mix 4 40 7"
		record noloop_python --lib $LIB -- $PY $SCRIPT $LIB $THREADS
		unset CUDATRACE_TEST_NO_BPF_LOOP
	fi
	# Nothing of cudatrace may stay loaded or attached.
	mkdir -p $O/after
	bpftool prog show >$O/after/progs.txt 2>&1
	bpftool link show >$O/after/links.txt 2>&1
fi

dmesg >$O/dmesg.txt
say "sending results"
echo "BEGIN-RESULTS" >$RESULTS
tar -C $O -czf - . | base64 >$RESULTS
echo "END-RESULTS" >$RESULTS
sync
poweroff -f

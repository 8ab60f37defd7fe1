#!/bin/busybox sh
# /init of the kernel matrix's initramfs (vmtest/kernels_test.go): runs
# cudatrace on the booted kernel and sends what it wrote, a gzipped tar in
# base64, over $RESULTS (x86-64: the second serial port; arm64's virt
# machine has one, the console, quiet at loglevel=1); the host test checks
# it against the stand-in's ground truth. Paths come from /vm/env, written
# by the host for the guest's architecture (ARCH); the mode from the
# kernel command line (ct_mode=full|floor|soak, ct_noloop=1, ct_dumps=1;
# the soak's ct_soak=, ct_pidmax=, ct_caps=).
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
	ct_soak=*) soak=${a#ct_soak=} ;;
	ct_pidmax=*) pidmax=${a#ct_pidmax=} ;;
	ct_caps=*) caps=${a#ct_caps=} ;;
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

# settle: until the agent's count of events read stops growing (it has
# read what the ring buffer held), at most 120 s.
settle() {
	prev=x
	for i in $(seq 120); do
		n=$(wget -q -O - http://127.0.0.1:9738/metrics | grep '^cudatrace_events_total ')
		[ "$n" = "$prev" ] && return 0
		prev=$n
		sleep 1
	done
	return 1
}

# spawn_at PID: the shell's next child gets PID (ns_last_pid), if it is free.
spawn_at() { echo $(($1 - 1)) >/proc/sys/kernel/ns_last_pid; }

# soak: the agent as the DaemonSet runs it (root with only the capabilities
# $caps names), PIDs wrapping (pid_max $pidmax), through the churn of
# soakchurn (ct_soak=NOP,CUDA,MID,RENAMED,PY,CONC,SAMPLES,SECONDS: killed
# after SECONDS), after a short one without the agent; then a Python CUDA job at the PID of a dead native CUDA job and a native one at a dead
# Python program's, as uid 65534, holding their memory while the agent's
# /metrics, profiles and BPF maps are read (vmtest/soak_test.go).
soak() {
	S=$O/soak
	mkdir -p $S/churn $S/jobs
	chmod 777 $S/jobs
	echo "$soak" | tr , ' ' >$S/plan
	echo $pidmax >/proc/sys/kernel/pid_max
	cat /proc/sys/kernel/pid_max >$S/pid_max
	# What the churn's processes cost here without the agent.
	mkdir -p $S/base
	read nop cuda mid ren py conc samples churnlimit <$S/plan
	say "soak: without the agent"
	timeout 120 $SOAKBIN/soakchurn run $S/base 0 65534 $conc 1 100 2 2 2 2 $SOAKBIN/soaknop $SOAKBIN/soakjob $PY $SOAKPY >$S/base.stdout 2>$S/base.stderr
	say "soak: agent"
	# util-linux's setpriv ($SETPRIV; busybox's has no --bounding-set).
	$SETPRIV --bounding-set $caps --inh-caps -all -- $CT agent --lib $LIB --listen 127.0.0.1:9738 --dump-dir "" \
		--nvml=false --retention 10s >$S/agent.stderr 2>&1 &
	ag=$!
	i=0
	while ! grep -q "cudatrace: attached" $S/agent.stderr; do
		i=$((i + 1))
		if [ $i -gt 600 ] || ! kill -0 $ag 2>/dev/null; then
			kill -TERM $ag
			return
		fi
		sleep 0.5
	done
	grep '^Cap' /proc/$ag/status >$S/agent.caps
	say "soak: churn of $nop $cuda $mid $ren $py"
	timeout $churnlimit $SOAKBIN/soakchurn run $S/churn $ag 65534 $conc $samples $nop $cuda $mid $ren $py \
		$SOAKBIN/soaknop $SOAKBIN/soakjob $PY $SOAKPY >$S/churn.stdout 2>$S/churn.stderr
	echo $? >$S/churn.rc
	say "soak: churn done"
	settle || say "soak: the agent still reads events"
	say "soak: settled"
	cp /proc/$ag/status $S/agent.status.churned

	as_nobody="$SETPRIV --reuid 65534 --regid 65534 --clear-groups --"
	# The Python CUDA job at the PID of a native job that has just exited
	# mid-allocation (the agent keeps a process's account for --retention
	# after its end).
	TORCHELASTIC_RUN_ID=soak-churn RANK=9999 $as_nobody $SOAKBIN/soakjob mid &
	want=$!
	wait $want
	echo "mid $want" >>$S/churn/pids.txt
	mkfifo /tmp/py.fifo /tmp/hold.fifo
	sleep 2
	spawn_at $want
	FAKECUDA_LOG=$S/jobs/py.log TORCHELASTIC_RUN_ID=soak-final RANK=3 $as_nobody $PY $PYAGENT $LIB \
		</tmp/py.fifo >$S/jobs/py.out 2>$S/jobs/py.err &
	pyjob=$!
	echo "$want $pyjob" >$S/jobs/py.pid
	exec 5>/tmp/py.fifo
	waitfor $S/jobs/py.out ready 120
	echo "weights 3145728" >&5
	echo "activations 5242880" >&5
	echo "weights 3145728" >&5
	i=0
	while [ $(grep -c '^ok' $S/jobs/py.out) -lt 3 ] && [ $i -lt 600 ]; do
		sleep 0.1
		i=$((i + 1))
	done
	# The native job at the PID of the last Python program.
	want=$(grep '^py ' $S/churn/pids.txt | tail -n 1 | cut -d' ' -f2)
	spawn_at $want
	FAKECUDA_LOG=$S/jobs/hold.log TORCHELASTIC_RUN_ID=soak-final RANK=5 $as_nobody $BIN/hold \
		</tmp/hold.fifo >$S/jobs/hold.out 2>$S/jobs/hold.err &
	holdjob=$!
	echo "$want $holdjob" >$S/jobs/hold.pid
	exec 6>/tmp/hold.fifo
	waitfor $S/jobs/hold.out ready 60
	echo go >&6
	waitfor $S/jobs/hold.out held 60
	cp $S/jobs/hold.log $S/jobs/hold.held.log
	cp $S/jobs/py.log $S/jobs/py.held.log
	settle
	sleep 2
	say "soak: reading the agent"

	# What is alive, the BPF maps' entries, and the agent's views.
	$SOAKBIN/soakchurn alive >$S/alive.txt
	ls -d /proc/[0-9]* | cut -d/ -f3 >$S/alive_pids.txt
	bpftool map show >$S/maps.txt 2>&1
	# Each hash map's entries (bpftool prints a map with BTF as JSON, one
	# "key" line an entry; one without says how many it found), and the
	# PIDs its entries are keyed by (a number, or a struct's tgid).
	mkdir -p $S/keys
	for id in $(awk -F'[: ]+' '$2 == "hash" || $2 == "lru_hash" {print $1}' $S/maps.txt); do
		bpftool map dump id $id >/tmp/dump
		n=$(grep -c '^        "key": ' /tmp/dump)
		f=$(sed -n 's/^Found \([0-9]*\) element.*/\1/p' /tmp/dump)
		echo "$id ${f:-$n}"
		grep -E '^        "key": [0-9]+,$|^            "tgid": [0-9]+,?$' /tmp/dump | tr -dc '0-9\n' >$S/keys/$id
	done >$S/map_counts.txt
	$SOAKBIN/soakchurn alive >>$S/alive.txt
	wget -q -O $S/metrics.txt http://127.0.0.1:9738/metrics
	wget -q -O $S/py.pb.gz "http://127.0.0.1:9738/debug/pprof/cuda_memory?pid=$pyjob"
	wget -q -O $S/hold.pb.gz "http://127.0.0.1:9738/debug/pprof/cuda_memory?pid=$holdjob"
	cp /proc/$ag/status $S/agent.status
	ls /proc/$ag/fd | wc -l >$S/agent.fds

	echo done >&6
	exec 6>&- 5>&-
	wait $holdjob
	echo $? >$S/jobs/hold.rc
	wait $pyjob
	echo $? >$S/jobs/py.rc
	kill -TERM $ag
	wait $ag
	echo $? >$S/agent.rc
	say "soak: done"
}

if [ "$mode" = floor ]; then
	record floor --lib $LIB -- $BIN/mix 1 1 1
elif [ "$mode" = soak ]; then
	soak
else
	# The runtime mix, with the default 16 KiB window; bpftool shows which
	# variant of ct_exit is loaded while it runs, and which kind of links
	# attach the uprobes (uprobe_multi from 6.6, perf_event before).
	record mix16 --lib $LIB -- sh -c "bpftool prog show >$O/mix16/progs.txt; bpftool link show >$O/mix16/links.txt; exec $BIN/mix 4 40 7"
	record mix0 --stack-window 0 --lib $LIB -- $BIN/mix 2 20 7
	record mix64 --stack-window 64KiB --lib $LIB -- $BIN/mix 2 20 7
	# Stacks unwound in BPF (its unwinder and its memo, as this kernel's
	# verifier takes them), each checked against the window's unwind of
	# the same event: uwmemo's 6000 allocations without frame pointers
	# (arm64: their return addresses signed), a millisecond apart (the
	# first come before the rules for its files are made, and fall back
	# to the window).
	export CUDATRACE_UNWIND=bpf CUDATRACE_TEST_UNWIND_CHECK=1
	record uwbpf --lib $LIB -- $BIN/uwmemo 2000
	unset CUDATRACE_UNWIND CUDATRACE_TEST_UNWIND_CHECK
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
		export CUDATRACE_UNWIND=bpf CUDATRACE_TEST_UNWIND_CHECK=1
		record noloop_uwbpf --lib $LIB -- sh -c "bpftool prog show >$O/noloop_uwbpf/progs.txt; exec $BIN/uwmemo 2000"
		unset CUDATRACE_UNWIND CUDATRACE_TEST_UNWIND_CHECK CUDATRACE_TEST_NO_BPF_LOOP
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

#!/bin/busybox sh
# PID 1 of the driver-hooks test VM (`cargo xtask vm`). Results go to the serial console as
# "LINGER-VM <tag> <text>" lines, which the host parses; everything else is boot noise.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf

say() { echo "LINGER-VM $*"; }
# Each line of a file, tagged.
tagged() { sed "s/^/LINGER-VM $1 /" "$2"; }
# Waits up to $3 tenths of a second for file $1 to contain $2; not at all once process $4
# (when given) has exited.
await() {
    i=0
    until grep -q "$2" "$1" 2>/dev/null; do
        [ $i -ge "$3" ] && return 1
        [ -n "${4:-}" ] && ! kill -0 "$4" 2>/dev/null && return 1
        sleep 0.1
        i=$((i + 1))
    done
}
# Waits for linger ($1) to end on its own, for up to $2 tenths of a second after the event it
# was started for, then stops it with SIGINT (said as $3-stopped); its exit status. A run's
# limit counts from that event, not from linger's start: under emulation, on shared cores,
# loading the programs alone can take minutes.
finish() {
    i=0
    while kill -0 "$1" 2>/dev/null; do
        if [ $i -ge "$2" ]; then
            say $3-stopped
            kill -INT "$1"
            break
        fi
        sleep 0.1
        i=$((i + 1))
    done
    wait "$1"
}
# Seconds since boot: when each step of a scenario happened, said with its results.
uptime_s() { cut -d' ' -f1 /proc/uptime; }

say kernel "$(uname -r)"
# Stand-in GPU files: /dev/full's device number, declared one with --gpu-device; and the
# stand-in driver's devices (GPU files by their majors, as the real driver's are).
mknod /tmp/gpu0 c 1 7

# The driver registers after linger started (a GPU operator's driver container): linger
# starts with no system call tracepoint, and once /proc/devices lists the driver it hooks the
# driver's functions (this kernel allows kprobes) or, with `--driver-hooks off`, attaches the
# system call tracepoints. With LIB=1 the driver comes with its library (the stand-in
# libcuda, installed where linger looks for it), which the GPU process calls through; with
# LIB=compat a second copy of it comes too, in a cuda-compat directory, and the GPU process
# loads that one through LD_LIBRARY_PATH, as a program using cuda-compat does. Then a
# GPU process allocates 1 GiB, forks a child that keeps its files, and both are SIGKILLed.
# $1: the tag; the rest: linger's options.
late_driver() {
    tag=$1
    shift
    # The last scenario's log says "tracing" too: gone before this one's linger starts.
    rm -f /tmp/live.out /tmp/live.err
    /linger live --json --events --no-nvml "$@" > /tmp/live.out 2> /tmp/live.err &
    live=$!
    lib=
    if await /tmp/live.err "linger: tracing" 1200 $live; then
        load=
        if [ -n "${LIB:-}" ]; then
            lib=/usr/lib/$(uname -m)-linux-gnu/libcuda.so.1
            mkdir -p "${lib%/*}"
            cp /libcuda.so.1 $lib
            load=$lib
        fi
        if [ "${LIB:-}" = compat ]; then
            mkdir -p /usr/local/cuda-12.8/compat
            cp /libcuda.so.1 /usr/local/cuda-12.8/compat/
            load=libcuda.so.1
        fi
        insmod /standin.ko delay_ms=200
        say $tag-insmod-exit $?
        if await /tmp/live.err "NVIDIA driver registered after start" 50; then
            mknod /tmp/nvidia0 c 195 0
            mknod /tmp/nvidia1 c 195 1
            mknod /tmp/nvidia-uvm c "$(sed -n 's/^ *\([0-9]*\) nvidia-uvm$/\1/p' /proc/devices)" 0
            compat_path=
            [ "${LIB:-}" = compat ] && compat_path=/usr/local/cuda-12.8/compat
            LINGER_VM_GPU_LIB=$load LD_LIBRARY_PATH=$compat_path sh -c 'exec 9<>/tmp/nvidia1; exec /linger-vm-gpu /tmp/nvidia0 /tmp/nvidia-uvm 1073741824 /tmp/held' &
            gpu=$!
            await /tmp/held held 300
            # Which libcuda the GPU process loaded.
            say $tag-libcuda "$(grep -m1 libcuda /proc/$gpu/maps | awk '{print $6}')"
            say $tag-holder $gpu
            say $tag-child "$(sed -n 's/^held //p' /tmp/held)"
            kill -9 $gpu
            wait $gpu
            sleep 1
            kill -9 "$(sed -n 's/^held //p' /tmp/held)"
            sleep 2
        fi
        kill -INT $live
    fi
    finish $live 600 $tag
    say $tag-exit $?
    tagged $tag-out /tmp/live.out
    tagged $tag-err /tmp/live.err
    rm -rf /tmp/held /tmp/nvidia0 /tmp/nvidia1 /tmp/nvidia-uvm $lib /usr/local/cuda-12.8
}
late_driver late-tp --driver-hooks off
rmmod nvidia
say late-rmmod-exit $?
LIB=1 late_driver late-lib --driver-hooks off
rmmod nvidia
say late-lib-rmmod-exit $?
LIB=compat late_driver late-compat --driver-hooks off
rmmod nvidia
say late-compat-rmmod-exit $?
late_driver late
# Whatever became of that, the driver and its nodes for what follows.
grep -q "^nvidia " /proc/modules || { insmod /standin.ko delay_ms=200; say insmod-exit $?; }
[ -e /tmp/nvidia0 ] || mknod /tmp/nvidia0 c 195 0
[ -e /tmp/nvidia1 ] || mknod /tmp/nvidia1 c 195 1
[ -e /tmp/nvidia-uvm ] ||
    mknod /tmp/nvidia-uvm c "$(sed -n 's/^ *\([0-9]*\) nvidia-uvm$/\1/p' /proc/devices)" 0

/linger doctor --json > /tmp/doctor.json 2> /tmp/doctor.err
say doctor-exit $?
tagged doctor /tmp/doctor.json
tagged doctor-err /tmp/doctor.err

# One scenario per driver-hook strategy. The holder opens and closes /tmp/gpu0 (the close
# path); runs an ioctl on nvidia0 (stty's TCGETS); closes nvidia0 (the RM cleanup sleeps) and
# nvidia1 (the driver defers it to a worker); and is SIGKILLed holding gpu0 and nvidia-uvm
# (the exit path, where the UVM release sleeps). The kill waits for the holder's deferred
# close: one more than the module counted before (the late scenario's GPU process left one),
# not a count of this loop's own (that was one short, and the wait then ran to its end).
for mode in fentry kprobe; do
    rm -f /tmp/live.* /tmp/held
    /linger live --json --events --no-nvml --driver-hooks $mode --gpu-device /tmp/gpu0 \
        --count 1 --record /tmp/live.trace > /tmp/live.out 2> /tmp/live.err &
    live=$!
    started=$(uptime_s) tracing= killed=
    if await /tmp/live.err "linger: tracing" 1200 $live; then
        tracing=$(uptime_s)
        deferred=$(($(cat /sys/module/nvidia/parameters/deferred_closes) + 1))
        sh -c 'exec 3<>/tmp/gpu0; exec 3>&-; exec 4<>/tmp/gpu0
               stty -F /tmp/nvidia0 2>/dev/null
               exec 5<>/tmp/nvidia0 6<>/tmp/nvidia1 7<>/tmp/nvidia-uvm
               exec 5>&- 6>&-
               echo held > /tmp/held; exec sleep 600' &
        holder=$!
        await /tmp/held held 300
        await /sys/module/nvidia/parameters/deferred_closes "^$deferred$" 300 ||
            say $mode-no-deferred-close
        say $mode-holder $holder
        kill -9 $holder
        killed=$(uptime_s)
        wait $holder
    fi
    # --count 1: linger ends with the holder's incident, which may take a while after the kill.
    finish $live 600 $mode
    say $mode-exit $?
    say $mode-times "started=$started tracing=$tracing killed=$killed ended=$(uptime_s)"
    tagged $mode-out /tmp/live.out
    tagged $mode-err /tmp/live.err
    /linger replay /tmp/live.trace --json --events > /tmp/replay.out 2> /tmp/replay.err
    say $mode-replay-exit $?
    tagged $mode-replay-out /tmp/replay.out
    tagged $mode-replay-err /tmp/replay.err
done
# The stock kernel's default strategy (no --gpu-device: the driver's own open and ioctl
# entries answer instead of system call tracepoints). A GPU process holding nvidia1 as fd 9
# (a second GPU) opens nvidia0 and nvidia-uvm, allocates 1 GiB through RM_ALLOC, forks a
# child that keeps its files and is SIGKILLed; then the child is, and its exit releases the
# files (the UVM release sleeps).
rm -f /tmp/live.* /tmp/held
/linger live --json --events --no-nvml --record /tmp/live.trace \
    > /tmp/live.out 2> /tmp/live.err &
live=$!
if await /tmp/live.err "linger: tracing" 1200 $live; then
    sh -c 'exec 9<>/tmp/nvidia1; exec /linger-vm-gpu /tmp/nvidia0 /tmp/nvidia-uvm 1073741824 /tmp/held' &
    gpu=$!
    await /tmp/held held 300
    child=$(sed -n 's/^held //p' /tmp/held)
    say driver-holder $gpu
    say driver-child $child
    kill -9 $gpu
    wait $gpu
    sleep 1
    kill -9 $child
    sleep 2
    kill -INT $live
fi
finish $live 600 driver
say driver-exit $?
tagged driver-out /tmp/live.out
tagged driver-err /tmp/live.err
/linger replay /tmp/live.trace --json --events > /tmp/replay.out 2> /tmp/replay.err
say driver-replay-exit $?
tagged driver-replay-out /tmp/replay.out
tagged driver-replay-err /tmp/replay.err
# A wedge without a kill: a GPU process's close of nvidia0 sleeps uninterruptibly in the
# driver's queue flush for 6 s (stall_ms); with --stuck-after 2s its thread is reported stuck,
# and again once the close returns. A second GPU process is stopped (SIGSTOP) all along: a
# stopped process is not stuck.
rm -f /tmp/live.* /tmp/held /tmp/held2
/linger live --json --no-nvml --stuck-after 2s > /tmp/live.out 2> /tmp/live.err &
live=$!
if await /tmp/live.err "linger: tracing" 1200 $live; then
    sh -c 'exec 5<>/tmp/nvidia0; echo held > /tmp/held2; exec sleep 600' &
    stopped=$!
    await /tmp/held2 held 300
    kill -STOP $stopped
    echo 6000 > /sys/module/nvidia/parameters/stall_ms
    sh -c 'exec 5<>/tmp/nvidia0; echo held > /tmp/held; exec 5>&-; echo closed > /tmp/held
           exec sleep 600' &
    holder=$!
    await /tmp/held held 300
    say stuck-holder $holder
    say stuck-stopped $stopped
    await /tmp/held closed 600
    echo 0 > /sys/module/nvidia/parameters/stall_ms
    say stuck-closed "$(cat /tmp/held)"
    # The next look (once a second) sees the thread out of its sleep.
    sleep 3
    kill -9 $holder $stopped
    kill -INT $live
fi
finish $live 600 stuck
say stuck-exit $?
tagged stuck-out /tmp/live.out
tagged stuck-err /tmp/live.err
# A wedge older than linger (an agent restarted on a wedged node): the close already sleeps in
# the queue flush when linger starts; its look through /proc at the start finds the thread,
# reported stuck 2 s later (asleep "at least" since the look), and cleared once the stall is
# lifted (writing 0 wakes it).
rm -f /tmp/live.* /tmp/held
echo 600000 > /sys/module/nvidia/parameters/stall_ms
sh -c 'exec 5<>/tmp/nvidia0; echo held > /tmp/held; exec 5>&-; echo closed > /tmp/held
       exec sleep 600' &
holder=$!
await /tmp/held held 300
say early-holder $holder
sleep 1
/linger live --json --no-nvml --stuck-after 2s > /tmp/live.out 2> /tmp/live.err &
live=$!
if await /tmp/live.err "linger: tracing" 1200 $live; then
    say early-tracing "$(uptime_s)"
    await /tmp/live.out '"type":"stuck"' 600 $live || say early-never-stuck
    echo 0 > /sys/module/nvidia/parameters/stall_ms
    await /tmp/held closed 600
    say early-closed "$(cat /tmp/held)"
    sleep 3
    kill -INT $live
fi
echo 0 > /sys/module/nvidia/parameters/stall_ms
kill -9 $holder
finish $live 600 early
say early-exit $?
tagged early-out /tmp/live.out
tagged early-err /tmp/live.err
# The host's integration tests that need no GPU (HOST_TESTS in vm.rs), on this kernel, with
# the stand-in driver loaded.
for t in /test-*; do
    name=${t#/test-}
    LINGER_BIN=/linger $t --test-threads=1 > /tmp/test.out 2>&1
    say test-$name-exit $?
    tagged test-$name-err /tmp/test.out
done
# Whole groups killed at once (killpg, a cgroup, a pid namespace's init, a job killed as its
# child exits, a job alone) on the stand-in driver, whose nvidia0 close sleeps 200 ms and logs
# the end of its free, under each strategy: the driver hooks this kernel allows, and none (the GPU
# machines' kernel). The churn runs 120 s (30 s under arm64's slower emulation).
mkdir -p /sys/fs/cgroup
mount -t cgroup2 cgroup2 /sys/fs/cgroup
churn=120
[ "$(uname -m)" = aarch64 ] && churn=30
# Every job's exit goes on 30 ms after the driver's free: it holds a file of another module
# whose release sleeps (as a GPU job's exit goes on after the driver's on a busy node). The
# memory is back at the free, not at the exit's end.
insmod /linger_slow.ko exit_ms=30
say slow-insmod-exit $?
mknod /tmp/linger-slow c "$(sed -n 's/^ *\([0-9]*\) linger-slow$/\1/p' /proc/devices)" 0
for t in /standin-test-*; do
    name=${t#/standin-test-}
    for strategy in hooks locked; do
        args=
        [ $strategy = locked ] && args="--driver-hooks off"
        LINGER_BIN=/linger LINGER_GROUP_JOB=/linger-group-job LINGER_TEST_GPU_DEVICE=/tmp/nvidia0 \
            LINGER_TEST_STANDIN_LOG=1 LINGER_TEST_LIVE_ARGS="$args" LINGER_GROUP_CHURN_S=$churn \
            LINGER_TEST_SLOW_EXIT=/tmp/linger-slow \
            $t --test-threads=1 --nocapture > /tmp/test.out 2>&1
        say test-$name-$strategy-exit $?
        tagged test-$name-$strategy-err /tmp/test.out
    done
done
say done
poweroff -f

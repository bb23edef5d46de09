// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for the NVIDIA driver's entry points, for linger's VM test (`cargo xtask vm`):
 * char major 195 as "nvidia" and a dynamic major as "nvidia-uvm", with the real driver's
 * function names so linger's kprobes attach by name: opens, the ioctl entry and the release
 * path. The RM cleanup and the UVM release sleep `delay_ms` (a slow teardown); closes of
 * minor 1 are handed to a worker through nvidia_close_deferred, as the real driver does when
 * it cannot take its locks at close. The ioctl STANDIN_FAULT reports an MMU fault (Xid 31)
 * naming the caller, through the driver's one tracepoint, as the driver does when a kernel
 * of the process writes through a bad pointer. While `stall_ms` (writable) is non-zero, every
 * close of nvidia0-1 first sleeps uninterruptibly that long in nv_kthread_q_flush, as threads
 * of the real driver stay stuck flushing its queue; writing 0 ends the sleeps under way. Each free's end is listed in
 * /proc/linger-standin-frees ("TGID BOOTTIME_NS" lines), the truth of the VM's group-kill
 * test.
 */
#include <linux/delay.h>
#include <linux/ktime.h>
#include <linux/fs.h>
#include <linux/ioctl.h>
#include <linux/module.h>
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/sched.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#define CREATE_TRACE_POINTS
#include "standin-xid.h"

/* The stand-in's own command: a GPU error for the caller. */
#define STANDIN_FAULT _IO('X', 31)

/* No inlining, cloning or renaming: kprobes find these by their real names. */
#define STANDIN noinline __attribute__((__noipa__))

static unsigned int delay_ms = 200;
module_param(delay_ms, uint, 0444);
/* A wedge: each close sleeps this long, uninterruptibly, in the queue flush; a write wakes
 * the sleepers, and 0 lets them go (a test ends a long wedge once it has seen it). */
static unsigned int stall_ms;
static DECLARE_WAIT_QUEUE_HEAD(stall_lifted);

static int stall_set(const char *val, const struct kernel_param *kp)
{
	int err = param_set_uint(val, kp);

	wake_up_all(&stall_lifted);
	return err;
}

static const struct kernel_param_ops stall_ops = {
	.set = stall_set,
	.get = param_get_uint,
};
module_param_cb(stall_ms, &stall_ops, &stall_ms, 0644);
/* Deferred closes finished, for the test to wait on. */
static int deferred_closes;
module_param(deferred_closes, int, 0444);

static int uvm_major;
static struct workqueue_struct *nv_queue;

/* The driver's per-open state (nv_linux_file_private_t). */
struct standin_file {
	struct work_struct deferred_close;
};

STANDIN void rm_cleanup_file_private(void *sp, void *nv, void *nvfp)
{
	msleep(delay_ms);
}

/* Each free's end, for /proc/linger-standin-frees: kept in place, since printing or waking a
 * worker from the driver's code would keep the freeing thread in it, or preempt it, for
 * milliseconds under emulation. */
#define FREES_MAX 32768
static struct {
	pid_t tgid;
	u64 at;
} frees[FREES_MAX];
static atomic_t frees_taken = ATOMIC_INIT(0);

/* The free's end, as the driver's code is left, on the stream's clock: the truth linger's
 * release is judged by. */
static void freed(void)
{
	u64 at = ktime_get_boottime_ns();
	int i = atomic_inc_return(&frees_taken) - 1;

	if (i < FREES_MAX) {
		frees[i].tgid = task_tgid_nr(current);
		frees[i].at = at;
	}
}

static int frees_show(struct seq_file *m, void *v)
{
	int n = min(atomic_read(&frees_taken), FREES_MAX);
	int i;

	for (i = 0; i < n; i++)
		seq_printf(m, "%d %llu\n", frees[i].tgid, frees[i].at);
	return 0;
}

STANDIN void nvidia_close_deferred(void *data)
{
	rm_cleanup_file_private(NULL, NULL, data);
	kfree(data);
	WRITE_ONCE(deferred_closes, deferred_closes + 1);
	freed();
}

static void deferred_close_work(struct work_struct *work)
{
	nvidia_close_deferred(container_of(work, struct standin_file, deferred_close));
}

STANDIN int nvidia_open(struct inode *inode, struct file *file)
{
	struct standin_file *nvlfp = kzalloc(sizeof(*nvlfp), GFP_KERNEL);

	if (!nvlfp)
		return -ENOMEM;
	INIT_WORK(&nvlfp->deferred_close, deferred_close_work);
	file->private_data = nvlfp;
	return 0;
}

/* Stalls finished: also keeps msleep from being a tail call, whose frame would replace this
 * function's on the sleeping thread's stack. */
static int stalls;

STANDIN void nv_kthread_q_flush(void *q)
{
	unsigned int ms = READ_ONCE(stall_ms);

	if (ms) {
		/* Uninterruptible, as msleep: the thread shows in state D. */
		wait_event_timeout(stall_lifted, !READ_ONCE(stall_ms), msecs_to_jiffies(ms));
		WRITE_ONCE(stalls, stalls + 1);
	}
}

STANDIN int nvidia_close(struct inode *inode, struct file *file)
{
	struct standin_file *nvlfp = file->private_data;

	nv_kthread_q_flush(nv_queue);
	file->private_data = NULL;
	if (iminor(inode) == 1) {
		queue_work(nv_queue, &nvlfp->deferred_close);
		return 0;
	}
	rm_cleanup_file_private(NULL, NULL, nvlfp);
	kfree(nvlfp);
	freed();
	return 0;
}

/* The RM's escapes ('F') succeed without doing anything: their parameters, and the status
 * the caller set in them, are what linger decodes. Anything else is not ours. */
STANDIN long nvidia_unlocked_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	char msg[128];

	if (cmd == STANDIN_FAULT) {
		snprintf(msg, sizeof(msg),
			 "pid=%d, name=%s, channel 0x00000002, intr 00000000. MMU Fault: stand-in",
			 task_tgid_nr(current), current->comm);
		trace_nvidia_dev_xid("0000:00:00.0", 31, msg);
		return 0;
	}
	return _IOC_TYPE(cmd) == 'F' ? 0 : -ENOTTY;
}

STANDIN int uvm_release_entry(struct inode *inode, struct file *file)
{
	msleep(delay_ms);
	return 0;
}

STANDIN int uvm_open_entry(struct inode *inode, struct file *file)
{
	return 0;
}

static const struct file_operations nvidia_fops = {
	.owner = THIS_MODULE,
	.open = nvidia_open,
	.release = nvidia_close,
	.unlocked_ioctl = nvidia_unlocked_ioctl,
};

static const struct file_operations uvm_fops = {
	.owner = THIS_MODULE,
	.open = uvm_open_entry,
	.release = uvm_release_entry,
};

static int __init standin_init(void)
{
	int err;

	nv_queue = alloc_workqueue("nv_queue", 0, 1);
	if (!nv_queue)
		return -ENOMEM;
	err = register_chrdev(195, "nvidia", &nvidia_fops);
	if (err)
		goto fail_queue;
	uvm_major = register_chrdev(0, "nvidia-uvm", &uvm_fops);
	if (uvm_major < 0) {
		err = uvm_major;
		goto fail_nvidia;
	}
	if (!proc_create_single("linger-standin-frees", 0444, NULL, frees_show)) {
		err = -ENOMEM;
		goto fail_uvm;
	}
	return 0;
fail_uvm:
	unregister_chrdev(uvm_major, "nvidia-uvm");
fail_nvidia:
	unregister_chrdev(195, "nvidia");
fail_queue:
	destroy_workqueue(nv_queue);
	return err;
}

static void __exit standin_exit(void)
{
	remove_proc_entry("linger-standin-frees", NULL);
	unregister_chrdev(uvm_major, "nvidia-uvm");
	unregister_chrdev(195, "nvidia");
	destroy_workqueue(nv_queue);
}

module_init(standin_init);
module_exit(standin_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("Stand-in for the NVIDIA driver's release path (linger VM test)");

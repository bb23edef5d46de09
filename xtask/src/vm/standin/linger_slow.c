// SPDX-License-Identifier: GPL-2.0
/*
 * A file whose release sleeps `exit_ms`, outside the stand-in driver (a module of its own, so
 * its code is not the driver's): a process holding it beside the stand-in GPU device goes on
 * exiting after the driver's free, as a GPU job's exit goes on after the real driver's (other
 * files' releases, exit_notify under the tasklist lock) on a busy node. Char device
 * "linger-slow", dynamic major.
 */
#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/module.h>

static unsigned int exit_ms = 30;
module_param(exit_ms, uint, 0444);

static int major;

static int slow_open(struct inode *inode, struct file *file)
{
	return 0;
}

static noinline int slow_release(struct inode *inode, struct file *file)
{
	msleep(exit_ms);
	return 0;
}

static const struct file_operations slow_fops = {
	.owner = THIS_MODULE,
	.open = slow_open,
	.release = slow_release,
};

static int __init slow_init(void)
{
	major = register_chrdev(0, "linger-slow", &slow_fops);
	return major < 0 ? major : 0;
}

static void __exit slow_exit(void)
{
	unregister_chrdev(major, "linger-slow");
}

module_init(slow_init);
module_exit(slow_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("A file whose release sleeps: an exit that goes on (linger VM test)");

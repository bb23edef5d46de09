/* The stand-in libcuda.so.1 of the VM's late-driver scenario: a GPU process opens and drives
 * the stand-in devices through it, so that its calls leave the library through the PLT entries
 * of open and ioctl, where linger's uprobes wait, as a CUDA program's calls leave libcuda. */
#include <fcntl.h>
#include <sys/ioctl.h>

int standin_open(const char *path)
{
	return open(path, O_RDWR | O_CLOEXEC);
}

int standin_ioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg);
}

/* A stand-in CUDA job for scripts/churn-cost/run.sh: GPU files opened and closed as libcuda
   does, a few hundred ioctls, worker threads, and memory whose freeing at the kill gives the
   teardown CPU time. With a third argument it forks a holder of its files that outlives it by
   a second. Usage: job DEVICE MB [fork] */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

static void *idle(void *arg) {
  for (;;) pause();
  return arg;
}

int main(int argc, char **argv) {
  long mb = argc > 2 ? atol(argv[2]) : 256;
  int keep[24], n = 0;
  for (int i = 0; i < 60; i++) {
    int f = open(argv[1], O_RDWR);
    if (n < 24) keep[n++] = f;
    else close(f);
  }
  for (int i = 0; i < 300; i++) ioctl(keep[i % n], 0xc0104600 + (i % 8), 0);
  char *m = mmap(0, mb << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  memset(m, 1, mb << 20);
  pid_t parent = getpid();
  if (argc > 3 && fork() == 0) {
    setsid();
    while (getppid() == parent) usleep(2000);
    sleep(1);
    _exit(0);
  }
  pthread_t t;
  for (int i = 0; i < 8; i++) pthread_create(&t, 0, idle, 0);
  for (;;) pause();
}

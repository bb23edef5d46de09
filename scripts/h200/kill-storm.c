/* fork, exec /bin/sleep 60, SIGKILL, waitpid: N times (argv[1]); the collector-cost.sh storm. */
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdlib.h>
int main(int c, char**v){int n=atoi(v[1]);for(int i=0;i<n;i++){pid_t p=fork();if(!p){execl("/bin/sleep","sleep","60",NULL);_exit(1);}kill(p,SIGKILL);waitpid(p,0,0);}return 0;}

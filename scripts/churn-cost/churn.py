# WORKERS threads for SECONDS, each starting stand-in jobs and SIGKILLing them after 0.5-4 s;
# one in five forks a holder that keeps the files a second past the kill. Prints the kills.
import random, signal, subprocess, sys, threading, time

job, device, seconds, workers, mb = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
kills = [0]


def work():
    start = time.time()
    while time.time() - start < seconds:
        fork = ["fork"] if random.random() < 0.2 else []
        p = subprocess.Popen([job, device, mb] + fork)
        time.sleep(random.uniform(0.5, 4.0))
        p.send_signal(signal.SIGKILL)
        p.wait()
        kills[0] += 1


threads = [threading.Thread(target=work) for _ in range(workers)]
[t.start() for t in threads]
[t.join() for t in threads]
print(kills[0])

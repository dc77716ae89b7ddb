/* slowcore FACTOR CPU...: makes each CPU named FACTOR times slower for whatever else runs on it.

   On each CPU a real-time (SCHED_FIFO) thread holds the core for (1 - 1/FACTOR) of every millisecond and
   sleeps for the rest, so another task there runs 1/FACTOR of each millisecond, however short its bursts.
   (A cgroup CPU quota is no substitute: it caps a share of each period, and work done in short bursts
   between waits, as a host waiting on its device does, stays under the cap and runs at full speed.)
   SIGSTOP and SIGCONT pause and resume it; SIGKILL ends it.

   Exit 3 with one line on stderr if real-time scheduling is refused (not root, no RLIMIT_RTPRIO). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PERIOD_NS 1000000L

static long busy_ns;

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *hold(void *arg) {
    (void)arg;
    struct timespec rest = {0, PERIOD_NS - busy_ns};
    for (;;) {
        long end = now_ns() + busy_ns;
        while (now_ns() < end) {
        }
        nanosleep(&rest, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: slowcore FACTOR CPU...\n");
        return 2;
    }
    double factor = atof(argv[1]);
    if (!(factor > 1)) {
        fprintf(stderr, "slowcore: FACTOR must be above 1, not %s\n", argv[1]);
        return 2;
    }
    busy_ns = (long)(PERIOD_NS * (1 - 1 / factor));
    int cpus = argc - 2;
    pthread_t threads[cpus];
    for (int i = 0; i < cpus; i++) {
        pthread_attr_t attr;
        struct sched_param param = {.sched_priority = 1};
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(argv[i + 2]), &set);
        pthread_attr_init(&attr);
        pthread_attr_setaffinity_np(&attr, sizeof set, &set);
        pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
        pthread_attr_setschedpolicy(&attr, SCHED_FIFO);
        pthread_attr_setschedparam(&attr, &param);
        int err = pthread_create(&threads[i], &attr, hold, NULL);
        if (err) {
            fprintf(stderr, "slowcore: real-time scheduling refused on CPU %s: %s\n", argv[i + 2], strerror(err));
            return 3;
        }
    }
    pthread_join(threads[0], NULL);
    return 0;
}

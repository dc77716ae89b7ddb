/* awake CPU...: keeps each CPU named from going idle while timed runs use it.

   On each CPU a SCHED_IDLE thread spins (with the pause hint), so the CPU never halts: a task woken there (the
   emulated device answering, llama-bench woken by its reply) runs at once, instead of after the hypervisor has
   woken a halted virtual CPU, which on a VM without guest halt-polling takes a varying tens of microseconds,
   many times per token. Any other task preempts a SCHED_IDLE thread at once, so it takes only idle time.
   SIGSTOP and SIGCONT pause and resume it; SIGKILL ends it. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *spin(void *arg) {
    (void)arg;
    for (;;) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ volatile("yield");
#endif
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: awake CPU...\n");
        return 2;
    }
    int cpus = argc - 1;
    pthread_t threads[cpus];
    for (int i = 0; i < cpus; i++) {
        pthread_attr_t attr;
        struct sched_param param = {.sched_priority = 0};
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(atoi(argv[i + 1]), &set);
        pthread_attr_init(&attr);
        pthread_attr_setaffinity_np(&attr, sizeof set, &set);
        pthread_attr_setinheritsched(&attr, PTHREAD_EXPLICIT_SCHED);
        pthread_attr_setschedpolicy(&attr, SCHED_IDLE);
        pthread_attr_setschedparam(&attr, &param);
        int err = pthread_create(&threads[i], &attr, spin, NULL);
        if (err) {
            fprintf(stderr, "awake: cannot start a thread on CPU %s: %s\n", argv[i + 1], strerror(err));
            return 3;
        }
    }
    pthread_join(threads[0], NULL);
    return 0;
}

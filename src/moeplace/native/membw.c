/*
 * membw: this host's memory read bandwidth with T threads, the ceiling a CPU decode step reads
 * its weights against.
 *
 * usage: moeplace-membw THREADS BYTES SECONDS
 * Each thread first-touches its own BYTES/THREADS slice (so it sits on the thread's NUMA node),
 * all start together, and each sums its slice over and over for SECONDS. The slice is far larger
 * than the caches, so what is timed is DRAM. Prints "threads=T bytes=B seconds=S gbps=G".
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static pthread_barrier_t start;
static double seconds;

struct slice {
    uint64_t *data;
    size_t words;
    size_t bytes_read;
    uint64_t sink;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *reader(void *arg) {
    struct slice *s = arg;
    for (size_t i = 0; i < s->words; i++) s->data[i] = i; /* first touch, and not all zero pages */
    pthread_barrier_wait(&start);
    double end = now() + seconds;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    do {
        const uint64_t *p = s->data;
        for (size_t i = 0; i + 8 <= s->words; i += 8) { /* one cache line per step, 8 independent sums */
            a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
            a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
        }
        s->bytes_read += s->words * sizeof(uint64_t);
    } while (now() < end);
    s->sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s THREADS BYTES SECONDS\n", argv[0]);
        return 2;
    }
    int threads = atoi(argv[1]);
    size_t bytes = strtoull(argv[2], NULL, 10);
    seconds = atof(argv[3]);
    if (threads < 1 || bytes < (size_t)threads * 4096 || seconds <= 0) {
        fprintf(stderr, "membw: need THREADS >= 1, BYTES >= 4096 per thread, SECONDS > 0\n");
        return 2;
    }
    pthread_t tid[threads];
    struct slice slices[threads];
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int t = 0; t < threads; t++) {
        slices[t] = (struct slice){.words = bytes / threads / sizeof(uint64_t)};
        if (posix_memalign((void **)&slices[t].data, 4096, slices[t].words * sizeof(uint64_t))) {
            fprintf(stderr, "membw: cannot allocate %zu bytes\n", bytes);
            return 1;
        }
        pthread_create(&tid[t], NULL, reader, &slices[t]);
    }
    pthread_barrier_wait(&start);
    double t0 = now();
    size_t total = 0;
    uint64_t sink = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        total += slices[t].bytes_read;
        sink ^= slices[t].sink;
    }
    double elapsed = now() - t0;
    printf("threads=%d bytes=%zu seconds=%.3f gbps=%.3f sink=%llu\n", threads, total, elapsed, total / elapsed / 1e9,
           (unsigned long long)sink);
    return 0;
}

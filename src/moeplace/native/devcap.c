/*
 * devcap: make a CPU-backed ggml RPC server behave like a device with a fixed memory size.
 *
 * Loaded with LD_PRELOAD into ggml-rpc-server. ggml's CPU buffers come from posix_memalign
 * (ggml_aligned_malloc: 64-byte alignment, 256 on s390x). Every aligned allocation (posix_memalign,
 * aligned_alloc, memalign, at any alignment) is counted, and one that would exceed
 * MOEPLACE_DEVICE_CAP_BYTES fails with ENOMEM, exactly as a full card refuses a buffer.
 * sysconf(_SC_PHYS_PAGES / _SC_AVPHYS_PAGES) reports the cap, so the device advertises it.
 * The table of live allocations grows as needed (it is kept at most half full, so every lookup ends);
 * if it cannot grow, the allocation is refused rather than left uncounted.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define FIRST_BITS 10 /* the table starts with 2^10 slots */

struct slot { void *ptr; size_t size; };

static size_t cap_bytes, used_bytes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct slot *table; /* open addressing with linear probing, at most half full */
static unsigned table_bits;
static size_t live;
static int (*real_posix_memalign)(void **, size_t, size_t);
static void *(*real_aligned_alloc)(size_t, size_t);
static void *(*real_memalign)(size_t, size_t);
static void (*real_free)(void *);
static long (*real_sysconf)(int);

#define RESOLVE(fn)                                        \
    do {                                                   \
        if (!real_##fn) real_##fn = dlsym(RTLD_NEXT, #fn); \
    } while (0)

__attribute__((constructor)) static void devcap_init(void) {
    RESOLVE(posix_memalign);
    RESOLVE(aligned_alloc);
    RESOLVE(memalign);
    RESOLVE(free);
    RESOLVE(sysconf);
    const char *cap = getenv("MOEPLACE_DEVICE_CAP_BYTES");
    cap_bytes = cap ? strtoull(cap, NULL, 10) : 0;
    fprintf(stderr, "devcap: device memory capped at %zu bytes (%.1f MiB)\n", cap_bytes, cap_bytes / 1048576.0);
}

static size_t mask(unsigned bits) { return ((size_t)1 << bits) - 1; }

/* Fibonacci hashing: the high bits of the product, so that large alignments (zero low bits) spread. */
static size_t slot_of(const void *p, unsigned bits) {
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static void put(struct slot *t, unsigned bits, void *p, size_t size) {
    size_t i = slot_of(p, bits);
    while (t[i].ptr) i = (i + 1) & mask(bits); /* ends: the table always has empty slots */
    t[i].ptr = p;
    t[i].size = size;
}

/* Room for one more live allocation, doubling the table when it would pass half full; 0 if it cannot grow. */
static int reserve(void) {
    if (table && 2 * (live + 1) <= ((size_t)1 << table_bits)) return 1;
    unsigned bits = table ? table_bits + 1 : FIRST_BITS;
    struct slot *t = mmap(NULL, sizeof *t << bits, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (t == MAP_FAILED) return 0;
    if (table) {
        for (size_t i = 0; i <= mask(table_bits); i++)
            if (table[i].ptr) put(t, bits, table[i].ptr, table[i].size);
        munmap(table, sizeof *table << table_bits);
    }
    table = t;
    table_bits = bits;
    return 1;
}

/* With the lock held: 0 if `size` more bytes fit under the cap and can be tracked, else ENOMEM (said on stderr). */
static int admit(size_t size) {
    if (size > cap_bytes - used_bytes) {
        fprintf(stderr, "devcap: out of device memory: refusing %zu bytes (%zu of %zu in use)\n", size, used_bytes,
                cap_bytes);
        return ENOMEM;
    }
    if (!reserve()) {
        fprintf(stderr, "devcap: no memory to track another allocation (%zu live): refusing %zu bytes\n", live,
                size);
        return ENOMEM;
    }
    return 0;
}

/* With the lock held, after admit(): count the allocation `p` just made. */
static void track(void *p, size_t size) {
    put(table, table_bits, p, size);
    live++;
    used_bytes += size;
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    RESOLVE(posix_memalign);
    if (cap_bytes == 0) return real_posix_memalign(out, alignment, size);
    pthread_mutex_lock(&lock);
    int rc = admit(size);
    if (rc == 0 && (rc = real_posix_memalign(out, alignment, size)) == 0 && *out) track(*out, size);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* aligned_alloc and memalign: the same, for a function that returns the pointer and sets errno. */
static void *counted(void *(*alloc)(size_t, size_t), size_t alignment, size_t size) {
    pthread_mutex_lock(&lock);
    int rc = admit(size);
    void *p = rc == 0 ? alloc(alignment, size) : NULL;
    if (p) track(p, size);
    pthread_mutex_unlock(&lock);
    if (rc) errno = rc;
    return p;
}

void *aligned_alloc(size_t alignment, size_t size) {
    RESOLVE(aligned_alloc);
    return cap_bytes ? counted(real_aligned_alloc, alignment, size) : real_aligned_alloc(alignment, size);
}

void *memalign(size_t alignment, size_t size) {
    RESOLVE(memalign);
    return cap_bytes ? counted(real_memalign, alignment, size) : real_memalign(alignment, size);
}

/* With the lock held: stop counting `p` if it is counted. */
static void forget(void *p) {
    size_t m = mask(table_bits);
    for (size_t i = slot_of(p, table_bits); table[i].ptr; i = (i + 1) & m) {
        if (table[i].ptr != p) continue;
        used_bytes -= table[i].size;
        live--;
        /* backward-shift deletion keeps the probe chains intact */
        for (size_t j = i;;) {
            j = (j + 1) & m;
            if (!table[j].ptr) break;
            size_t home = slot_of(table[j].ptr, table_bits);
            if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
                table[i] = table[j];
                i = j;
            }
        }
        table[i].ptr = NULL;
        return;
    }
}

void free(void *p) {
    RESOLVE(free);
    if (p && cap_bytes) {
        pthread_mutex_lock(&lock);
        if (table) forget(p);
        pthread_mutex_unlock(&lock);
    }
    real_free(p);
}

long sysconf(int name) {
    RESOLVE(sysconf);
    long page = real_sysconf(_SC_PAGESIZE);
    if (cap_bytes && name == _SC_PHYS_PAGES) return (long)(cap_bytes / page);
    if (cap_bytes && name == _SC_AVPHYS_PAGES) return (long)((cap_bytes - used_bytes) / page);
    return real_sysconf(name);
}

/*
 * devcap: make a CPU-backed ggml RPC server behave like a device with a fixed memory size.
 *
 * Loaded with LD_PRELOAD into ggml-rpc-server. ggml's CPU buffers come from posix_memalign
 * with 64-byte alignment (ggml_aligned_malloc); those allocations are counted, and one that
 * would exceed MOEPLACE_DEVICE_CAP_BYTES fails with ENOMEM, exactly as a full card refuses a
 * buffer. sysconf(_SC_PHYS_PAGES / _SC_AVPHYS_PAGES) reports the cap, so the device advertises it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define GGML_ALIGNMENT 64
#define SLOTS 65536 /* open-addressing table of live counted allocations */

static size_t cap_bytes, used_bytes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { void *ptr; size_t size; } table[SLOTS];
static int (*real_posix_memalign)(void **, size_t, size_t);
static void (*real_free)(void *);
static long (*real_sysconf)(int);

__attribute__((constructor)) static void devcap_init(void) {
    real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    real_free = dlsym(RTLD_NEXT, "free");
    real_sysconf = dlsym(RTLD_NEXT, "sysconf");
    const char *cap = getenv("MOEPLACE_DEVICE_CAP_BYTES");
    cap_bytes = cap ? strtoull(cap, NULL, 10) : 0;
    fprintf(stderr, "devcap: device memory capped at %zu bytes (%.1f MiB)\n", cap_bytes, cap_bytes / 1048576.0);
}

static size_t slot_of(void *p) { return ((uintptr_t)p >> 6) % SLOTS; }

int posix_memalign(void **out, size_t alignment, size_t size) {
    if (!real_posix_memalign) real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    if (alignment != GGML_ALIGNMENT || cap_bytes == 0) return real_posix_memalign(out, alignment, size);
    pthread_mutex_lock(&lock);
    if (used_bytes + size > cap_bytes) {
        fprintf(stderr, "devcap: out of device memory: refusing %zu bytes (%zu of %zu in use)\n", size, used_bytes,
                cap_bytes);
        pthread_mutex_unlock(&lock);
        return ENOMEM;
    }
    int rc = real_posix_memalign(out, alignment, size);
    if (rc == 0) {
        size_t i = slot_of(*out);
        while (table[i].ptr) i = (i + 1) % SLOTS;
        table[i].ptr = *out;
        table[i].size = size;
        used_bytes += size;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void free(void *p) {
    if (!real_free) real_free = dlsym(RTLD_NEXT, "free");
    if (p && cap_bytes) {
        pthread_mutex_lock(&lock);
        for (size_t i = slot_of(p), n = 0; table[i].ptr && n < SLOTS; i = (i + 1) % SLOTS, n++) {
            if (table[i].ptr == p) {
                used_bytes -= table[i].size;
                /* backward-shift deletion keeps the probe chains intact */
                size_t j = i;
                for (;;) {
                    j = (j + 1) % SLOTS;
                    if (!table[j].ptr) break;
                    size_t home = slot_of(table[j].ptr);
                    if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
                        table[i] = table[j];
                        i = j;
                    }
                }
                table[i].ptr = NULL;
                break;
            }
        }
        pthread_mutex_unlock(&lock);
    }
    real_free(p);
}

long sysconf(int name) {
    if (!real_sysconf) real_sysconf = dlsym(RTLD_NEXT, "sysconf");
    long page = real_sysconf(_SC_PAGESIZE);
    if (cap_bytes && name == _SC_PHYS_PAGES) return (long)(cap_bytes / page);
    if (cap_bytes && name == _SC_AVPHYS_PAGES) return (long)((cap_bytes - used_bytes) / page);
    return real_sysconf(name);
}

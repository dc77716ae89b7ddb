/*
 * pagelock: lock chosen byte ranges of a model file in RAM once llama.cpp has mmap'd it.
 *
 * Loaded with LD_PRELOAD into llama-bench. mmap (and mmap64) are interposed; a file mapping
 * whose fd is one of the model files (same st_dev and st_ino as the path in
 * MOEPLACE_PAGELOCK_FILE, or MOEPLACE_PAGELOCK_FILE_1, _2, ... for the shards of a split model)
 * is made as asked, and then
 *   - the file ranges in MOEPLACE_PAGELOCK_RANGES (_1, _2, ...) = "off:len,off:len,..." (decimal
 *     file offsets, whole pages, sorted and not overlapping: ram_tier.merge_ranges makes them so)
 *     are mlock'ed where they lie inside the mapping;
 *   - with MOEPLACE_MADVISE=random, the whole mapping gets MADV_RANDOM (no read-around on faults).
 * One line per model mapping tells the runner what was done:
 *   pagelock: locked N bytes in M ranges (madvise=random|none) of PATH
 * and every failure (mlock, madvise, a malformed variable) gets its own "pagelock: ..." line.
 * llama.cpp's own --mlock is all-or-nothing; this locks only the ranges given (e.g. the
 * non-expert tensors), so the page cache left under a memory cap serves the experts.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#define MAX_FILES 256

struct range {
    uint64_t off, len;
};

struct target {
    const char *path;
    dev_t dev;
    ino_t ino;
    struct range *ranges;
    size_t n_ranges;
};

static struct target targets[MAX_FILES];
static int n_targets;
static int madvise_random;
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off64_t);

static const char *env_name(char *buf, size_t size, const char *base, int i) {
    if (i == 0) return base;
    snprintf(buf, size, "%s_%d", base, i);
    return buf;
}

/* "off:len,off:len,..." -> ranges; 0 on success, -1 (with a message) when malformed. */
static int parse_ranges(const char *name, const char *text, struct target *t) {
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    t->ranges = calloc(cap, sizeof *t->ranges);
    if (!t->ranges) return -1;
    const char *p = text;
    while (*p) {
        char *end;
        errno = 0;
        unsigned long long off = strtoull(p, &end, 10);
        if (end == p || *end != ':' || errno) goto bad;
        p = end + 1;
        unsigned long long len = strtoull(p, &end, 10);
        if (end == p || (*end != ',' && *end) || errno) goto bad;
        p = *end ? end + 1 : end;
        if (len) t->ranges[t->n_ranges++] = (struct range){off, len};
    }
    return 0;
bad:
    fprintf(stderr, "pagelock: %s is malformed near '%.40s' (expected off:len,off:len,...); locking nothing\n", name,
            p);
    t->n_ranges = 0;
    return -1;
}

__attribute__((constructor)) static void pagelock_init(void) {
    real_mmap = dlsym(RTLD_NEXT, "mmap");
    real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
    const char *mode = getenv("MOEPLACE_MADVISE");
    if (mode && !strcmp(mode, "random")) {
        madvise_random = 1;
    } else if (mode && *mode && strcmp(mode, "none")) {
        fprintf(stderr, "pagelock: MOEPLACE_MADVISE=%s is not 'random' or 'none'; not advising\n", mode);
    }
    for (int i = 0; i < MAX_FILES; i++) {
        char file_var[64], ranges_var[64];
        const char *path = getenv(env_name(file_var, sizeof file_var, "MOEPLACE_PAGELOCK_FILE", i));
        if (!path) break;
        struct stat st;
        if (stat(path, &st)) {
            fprintf(stderr, "pagelock: cannot stat %s (%s); it will not be recognised\n", path, strerror(errno));
            continue;
        }
        struct target *t = &targets[n_targets++];
        t->path = path;
        t->dev = st.st_dev;
        t->ino = st.st_ino;
        const char *name = env_name(ranges_var, sizeof ranges_var, "MOEPLACE_PAGELOCK_RANGES", i);
        const char *text = getenv(name);
        if (text && *text) parse_ranges(name, text, t);
    }
}

static void act(void *addr, size_t length, off_t offset, const struct target *t) {
    const uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    const uint64_t map_lo = (uint64_t)offset, map_hi = map_lo + ((length + page - 1) & ~(page - 1));
    uint64_t locked = 0;
    size_t n_locked = 0;
    for (size_t i = 0; i < t->n_ranges; i++) {
        uint64_t lo = t->ranges[i].off, hi = t->ranges[i].off + t->ranges[i].len;
        if (lo < map_lo) lo = map_lo;
        if (hi > map_hi) hi = map_hi;
        if (hi <= lo) continue;
        if (mlock((char *)addr + (lo - map_lo), hi - lo) == 0) {
            locked += hi - lo;
            n_locked++;
        } else {
            int err = errno;
            struct rlimit rl;
            getrlimit(RLIMIT_MEMLOCK, &rl);
            fprintf(stderr,
                    "pagelock: mlock of %llu bytes at file offset %llu of %s failed: %s "
                    "(RLIMIT_MEMLOCK soft %lld, hard %lld; %llu bytes locked before it)\n",
                    (unsigned long long)(hi - lo), (unsigned long long)lo, t->path, strerror(err),
                    (long long)(rl.rlim_cur == RLIM_INFINITY ? -1 : (long long)rl.rlim_cur),
                    (long long)(rl.rlim_max == RLIM_INFINITY ? -1 : (long long)rl.rlim_max),
                    (unsigned long long)locked);
        }
    }
    int advised = 0;
    if (madvise_random) {
        if (madvise(addr, length, MADV_RANDOM) == 0) {
            advised = 1;
        } else {
            fprintf(stderr, "pagelock: madvise(MADV_RANDOM) on %s failed: %s\n", t->path, strerror(errno));
        }
    }
    fprintf(stderr, "pagelock: locked %llu bytes in %zu ranges (madvise=%s) of %s\n", (unsigned long long)locked,
            n_locked, advised ? "random" : "none", t->path);
}

static void *after_map(void *addr, size_t length, int flags, int fd, off_t offset) {
    if (addr == MAP_FAILED || fd < 0 || (flags & MAP_ANONYMOUS) || n_targets == 0) return addr;
    struct stat st;
    if (fstat(fd, &st)) return addr;
    for (int i = 0; i < n_targets; i++) {
        if (targets[i].dev == st.st_dev && targets[i].ino == st.st_ino) {
            int saved = errno;
            act(addr, length, offset, &targets[i]);
            errno = saved;
            break;
        }
    }
    return addr;
}

void *mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset) {
    if (!real_mmap) real_mmap = dlsym(RTLD_NEXT, "mmap");
    return after_map(real_mmap(addr, length, prot, flags, fd, offset), length, flags, fd, offset);
}

void *mmap64(void *addr, size_t length, int prot, int flags, int fd, off64_t offset) {
    if (!real_mmap64) real_mmap64 = dlsym(RTLD_NEXT, "mmap64");
    return after_map(real_mmap64(addr, length, prot, flags, fd, offset), length, flags, fd, (off_t)offset);
}

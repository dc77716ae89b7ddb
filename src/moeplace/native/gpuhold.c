/*
 * gpuhold: make a GPU look like a smaller card by holding the rest of its free memory.
 *
 * Usage: moeplace-gpuhold DEVICE KEEP_FREE_BYTES
 *
 * Loads the CUDA driver (cuda_driver.h), creates a context on DEVICE and allocates plain device memory
 * (cuMemAlloc: never managed memory, which the driver could evict) in chunks until cuMemGetInfo reports at most
 * KEEP_FREE_BYTES free, plus the size of one CUDA context: the job's own process makes one out of that free
 * memory, so the cap is what the job's buffers can have. It then prints one line,
 * "held <bytes> free <bytes> total <bytes> context <bytes>", and waits for a signal: SIGTERM when the job ends,
 * SIGKILL when its parent dies (PR_SET_PDEATHSIG), so the memory returns with the job that asked for it, on
 * every exit path. Exit status is non-zero, with one line on stderr, when the driver or the device is unusable.
 */
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cuda_driver.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEVICE KEEP_FREE_BYTES\n", argv[0]);
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) return 3; /* the parent is already gone */
    void *lib = cuda_driver("gpuhold");
    CUresult (*cuMemGetInfo)(size_t *, size_t *) = cuda_symbol(lib, "cuMemGetInfo_v2");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = cuda_symbol(lib, "cuMemAlloc_v2");
    CUresult (*cuCtxDestroy)(CUcontext) = cuda_symbol(lib, "cuCtxDestroy_v2");
    cuda_context(lib, atoi(argv[1]));
    size_t free_bytes = 0, total = 0, held = 0, before = 0, context = 0;
    size_t keep = strtoull(argv[2], NULL, 10);
    if (cuMemGetInfo(&before, &total)) {
        fprintf(stderr, "gpuhold: CUDA device %s is not usable\n", argv[1]);
        return 2;
    }
    CUcontext probe = cuda_context(lib, atoi(argv[1])); /* a second context of ours: its size is the job's */
    if (!cuMemGetInfo(&free_bytes, &total) && free_bytes < before) context = before - free_bytes;
    if (cuCtxDestroy(probe) || cuMemGetInfo(&free_bytes, &total)) {
        fprintf(stderr, "gpuhold: CUDA device %s is not usable\n", argv[1]);
        return 2;
    }
    keep += context;
    /* Large chunks first, then smaller ones, down to 2 MiB: the held total ends within 2 MiB of the target. */
    for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)2 << 20); chunk >>= 1) {
        while (free_bytes > keep && free_bytes - keep >= chunk) {
            CUdeviceptr ptr;
            if (cuMemAlloc(&ptr, chunk)) break;
            held += chunk;
            if (cuMemGetInfo(&free_bytes, &total)) break;
        }
    }
    printf("held %zu free %zu total %zu context %zu\n", held, free_bytes, total, context);
    fflush(stdout);
    for (;;) pause(); /* the driver frees everything when the process ends */
}

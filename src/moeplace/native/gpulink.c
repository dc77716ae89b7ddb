/*
 * gpulink: what one token's trips between host and GPU cost, measured through the CUDA driver.
 *
 * Usage: moeplace-gpulink DEVICE BYTES TRIALS
 *
 * Prints one line per measurement, "<name> <value>", each the best of TRIALS:
 *   device_copy_gbps          a BYTES device-to-device copy, counted as 2 x BYTES (read and write): the card's
 *                             memory bandwidth as a copy sees it
 *   host_to_device_pinned_gbps   BYTES from page-locked host memory (cuMemAllocHost)
 *   host_to_device_pageable_gbps BYTES from ordinary malloc'd memory: how llama.cpp's mmapped host weights travel
 *   device_to_host_pinned_gbps   BYTES back to page-locked host memory
 *   round_trip_us             a 16 KiB copy to the device and back: one hop of activations (a token's hidden state
 *                             at a host/device boundary), latency-bound
 * Exit status is non-zero, with one line on stderr, when the driver or the device is unusable.
 */
#include "cuda_driver.h" /* first: it defines _GNU_SOURCE */

#include <string.h>
#include <time.h>

static CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
static CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cuCtxSynchronize)(void);

enum kind { DTOD, HTOD, DTOH, ROUND_TRIP };
enum { ROUND_TRIP_BYTES = 16384 }; /* one hop's activations: a token's hidden state at a host/device boundary */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Seconds for the fastest of `trials` copies (after one untimed warm-up). */
static double best(enum kind kind, CUdeviceptr dev, CUdeviceptr dev2, void *host, size_t bytes, int trials) {
    double fastest = 1e30;
    for (int i = 0; i <= trials; i++) {
        double t0 = now();
        CUresult r = 0;
        switch (kind) {
        case DTOD: r = cuMemcpyDtoD(dev2, dev, bytes); break;
        case HTOD: r = cuMemcpyHtoD(dev, host, bytes); break;
        case DTOH: r = cuMemcpyDtoH(host, dev, bytes); break;
        case ROUND_TRIP:
            r = cuMemcpyHtoD(dev, host, bytes);
            if (!r) r = cuMemcpyDtoH(host, dev, bytes);
            break;
        }
        if (r || cuCtxSynchronize()) {
            fprintf(stderr, "gpulink: a CUDA copy of %zu bytes failed (error %d)\n", bytes, r);
            exit(2);
        }
        double t = now() - t0;
        if (i > 0 && t < fastest) fastest = t;
    }
    return fastest;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DEVICE BYTES TRIALS\n", argv[0]);
        return 2;
    }
    void *lib = cuda_driver("gpulink");
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t) = cuda_symbol(lib, "cuMemAlloc_v2");
    CUresult (*cuMemAllocHost)(void **, size_t) = cuda_symbol(lib, "cuMemAllocHost_v2");
    cuMemcpyDtoD = cuda_symbol(lib, "cuMemcpyDtoD_v2");
    cuMemcpyHtoD = cuda_symbol(lib, "cuMemcpyHtoD_v2");
    cuMemcpyDtoH = cuda_symbol(lib, "cuMemcpyDtoH_v2");
    cuCtxSynchronize = cuda_symbol(lib, "cuCtxSynchronize");
    cuda_context(lib, atoi(argv[1]));
    size_t bytes = strtoull(argv[2], NULL, 10);
    int trials = atoi(argv[3]);
    if (bytes < ROUND_TRIP_BYTES || trials < 1) {
        fprintf(stderr, "gpulink: BYTES must be at least %d and TRIALS at least 1\n", ROUND_TRIP_BYTES);
        return 2;
    }
    CUdeviceptr a, b;
    void *pinned, *pageable = malloc(bytes);
    if (!pageable || cuMemAlloc(&a, bytes) || cuMemAlloc(&b, bytes) || cuMemAllocHost(&pinned, bytes)) {
        fprintf(stderr, "gpulink: cannot allocate 2 x %zu bytes on the device and %zu on the host\n", bytes, bytes);
        return 2;
    }
    memset(pageable, 1, bytes); /* touched: the copy measures the link, not page faults */
    memset(pinned, 1, bytes);
    printf("device_copy_gbps %.3f\n", 2.0 * bytes / best(DTOD, a, b, NULL, bytes, trials) / 1e9);
    printf("host_to_device_pinned_gbps %.3f\n", bytes / best(HTOD, a, 0, pinned, bytes, trials) / 1e9);
    printf("host_to_device_pageable_gbps %.3f\n", bytes / best(HTOD, a, 0, pageable, bytes, trials) / 1e9);
    printf("device_to_host_pinned_gbps %.3f\n", bytes / best(DTOH, a, 0, pinned, bytes, trials) / 1e9);
    printf("round_trip_us %.3f\n", best(ROUND_TRIP, a, 0, pinned, ROUND_TRIP_BYTES, trials) * 1e6);
    return 0;
}

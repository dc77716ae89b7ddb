/*
 * The CUDA driver API, loaded at run time: our GPU helpers build without the CUDA toolkit and run wherever
 * the driver (libcuda.so.1) is, or against the library named by MOEPLACE_CUDA_DRIVER (the tests' stand-in).
 */
#ifndef MOEPLACE_CUDA_DRIVER_H
#define MOEPLACE_CUDA_DRIVER_H
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUdeviceptr;

static const char *cuda_tool = "moeplace";

static void *cuda_symbol(void *lib, const char *name) {
    void *sym = dlsym(lib, name);
    if (!sym) {
        fprintf(stderr, "%s: the CUDA driver has no %s\n", cuda_tool, name);
        exit(2);
    }
    return sym;
}

/* The driver library, or exit 2 with one line on stderr. */
static void *cuda_driver(const char *tool) {
    cuda_tool = tool;
    const char *driver = getenv("MOEPLACE_CUDA_DRIVER");
    void *lib = dlopen(driver && *driver ? driver : "libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s: cannot load the CUDA driver (%s)\n", tool, dlerror());
        exit(2);
    }
    return lib;
}

/* A context on device `index`, or exit 2 with one line on stderr. */
static CUcontext cuda_context(void *lib, int index) {
    CUresult (*cuInit)(unsigned int) = cuda_symbol(lib, "cuInit");
    CUresult (*cuDeviceGet)(CUdevice *, int) = cuda_symbol(lib, "cuDeviceGet");
    CUresult (*cuCtxCreate)(CUcontext *, unsigned int, CUdevice) = cuda_symbol(lib, "cuCtxCreate_v2");
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, index) || cuCtxCreate(&ctx, 0, dev)) {
        fprintf(stderr, "%s: CUDA device %d is not usable\n", cuda_tool, index);
        exit(2);
    }
    return ctx;
}
#endif

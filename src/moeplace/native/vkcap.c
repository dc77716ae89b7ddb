/*
 * vkcap: make Mesa's lavapipe (a Vulkan device on the CPU) look and behave like a discrete card of a fixed size.
 *
 * Loaded with LD_PRELOAD into a llama.cpp process of the Vulkan build. llama.cpp resolves every Vulkan function
 * through vkGetInstanceProcAddr / vkGetDeviceProcAddr, which this library exports first, handing back its own
 * versions of the few that concern memory. lavapipe has one heap (a fixed 2048 MiB, not enforced) and one memory
 * type that is device-local and host-visible at once, so llama.cpp's device buffers and its pinned host buffers
 * (Vulkan_Host, staging) would be the same memory. Here it shows two, as a discrete card does:
 *   heap 0, device-local, MOEPLACE_DEVICE_CAP_BYTES in size, with memory type 0 (device-local, not host-visible);
 *   heap 1, host memory, lavapipe's own size, with memory type 1 (host-visible, coherent, cached).
 * Both are lavapipe's one real type underneath. Allocations of type 0 are counted, and one that would exceed the
 * cap fails with VK_ERROR_OUT_OF_DEVICE_MEMORY, as a full card's does; type 1 is not counted. Where the driver
 * reports a memory budget (VK_EXT_memory_budget), heap 0's budget is the cap and its usage what is counted.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>

#define MAX_LIVE 65536

static uint64_t cap_bytes, used_bytes;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct { VkDeviceMemory memory; VkDeviceSize size; } live[MAX_LIVE];
static size_t n_live;

static PFN_vkGetInstanceProcAddr real_gipa;
static PFN_vkGetDeviceProcAddr real_gdpa;
static PFN_vkGetPhysicalDeviceMemoryProperties real_props;
static PFN_vkGetPhysicalDeviceMemoryProperties2 real_props2;
static PFN_vkGetBufferMemoryRequirements real_reqs;
static PFN_vkGetBufferMemoryRequirements2 real_reqs2;
static PFN_vkGetMemoryHostPointerPropertiesEXT real_host_ptr;
static PFN_vkAllocateMemory real_alloc;
static PFN_vkFreeMemory real_free;

__attribute__((constructor)) static void vkcap_init(void) {
    const char *cap = getenv("MOEPLACE_DEVICE_CAP_BYTES");
    cap_bytes = cap ? strtoull(cap, NULL, 10) : 0;
    fprintf(stderr, "vkcap: Vulkan device memory capped at %llu bytes (%.1f MiB)\n", (unsigned long long)cap_bytes,
            cap_bytes / 1048576.0);
}

/* lavapipe's one type split in two: 0 device-local (heap 0, the cap), 1 host-visible (heap 1, the real heap). */
static void split(VkPhysicalDeviceMemoryProperties *p) {
    if (p->memoryTypeCount != 1 || p->memoryHeapCount != 1) return; /* not lavapipe's layout: left alone */
    VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                 (p->memoryTypes[0].propertyFlags & VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    p->memoryHeaps[1].size = p->memoryHeaps[0].size;
    p->memoryHeaps[1].flags = 0;
    p->memoryHeaps[0].size = cap_bytes;
    p->memoryHeaps[0].flags = VK_MEMORY_HEAP_DEVICE_LOCAL_BIT;
    p->memoryTypes[0] = (VkMemoryType){VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0};
    p->memoryTypes[1] = (VkMemoryType){host, 1};
    p->memoryHeapCount = 2;
    p->memoryTypeCount = 2;
}

static VKAPI_ATTR void VKAPI_CALL props(VkPhysicalDevice dev, VkPhysicalDeviceMemoryProperties *p) {
    real_props(dev, p);
    split(p);
}

static VKAPI_ATTR void VKAPI_CALL props2(VkPhysicalDevice dev, VkPhysicalDeviceMemoryProperties2 *p) {
    real_props2(dev, p);
    int lavapipe = p->memoryProperties.memoryTypeCount == 1 && p->memoryProperties.memoryHeapCount == 1;
    split(&p->memoryProperties);
    for (VkBaseOutStructure *s = p->pNext; lavapipe && s; s = s->pNext) {
        if (s->sType != VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT) continue;
        VkPhysicalDeviceMemoryBudgetPropertiesEXT *b = (VkPhysicalDeviceMemoryBudgetPropertiesEXT *)s;
        b->heapBudget[1] = b->heapBudget[0];
        b->heapUsage[1] = b->heapUsage[0];
        pthread_mutex_lock(&lock);
        b->heapBudget[0] = cap_bytes;
        b->heapUsage[0] = used_bytes;
        pthread_mutex_unlock(&lock);
    }
}

/* Every buffer may live in either type (lavapipe's requirements name its one type). */
static VKAPI_ATTR void VKAPI_CALL reqs(VkDevice dev, VkBuffer buf, VkMemoryRequirements *r) {
    real_reqs(dev, buf, r);
    if (r->memoryTypeBits & 1u) r->memoryTypeBits = 3u;
}

static VKAPI_ATTR void VKAPI_CALL reqs2(VkDevice dev, const VkBufferMemoryRequirementsInfo2 *info,
                                       VkMemoryRequirements2 *r) {
    real_reqs2(dev, info, r);
    if (r->memoryRequirements.memoryTypeBits & 1u) r->memoryRequirements.memoryTypeBits = 3u;
}

/* An imported host pointer is host memory: type 1. */
static VKAPI_ATTR VkResult VKAPI_CALL host_ptr(VkDevice dev, VkExternalMemoryHandleTypeFlagBits type,
                                               const void *ptr, VkMemoryHostPointerPropertiesEXT *p) {
    VkResult rc = real_host_ptr(dev, type, ptr, p);
    if (rc == VK_SUCCESS && (p->memoryTypeBits & 1u)) p->memoryTypeBits = 2u;
    return rc;
}

static VKAPI_ATTR VkResult VKAPI_CALL alloc(VkDevice dev, const VkMemoryAllocateInfo *info,
                                            const VkAllocationCallbacks *cb, VkDeviceMemory *out) {
    VkMemoryAllocateInfo real_info = *info;
    int device_local = info->memoryTypeIndex == 0;
    real_info.memoryTypeIndex = 0;
    if (!device_local) return real_alloc(dev, &real_info, cb, out);
    pthread_mutex_lock(&lock);
    if (info->allocationSize > cap_bytes - used_bytes || n_live == MAX_LIVE) {
        fprintf(stderr, "vkcap: out of device memory: refusing %llu bytes (%llu of %llu in use)\n",
                (unsigned long long)info->allocationSize, (unsigned long long)used_bytes,
                (unsigned long long)cap_bytes);
        pthread_mutex_unlock(&lock);
        return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    }
    VkResult rc = real_alloc(dev, &real_info, cb, out);
    if (rc == VK_SUCCESS) {
        live[n_live].memory = *out;
        live[n_live++].size = info->allocationSize;
        used_bytes += info->allocationSize;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

static VKAPI_ATTR void VKAPI_CALL release(VkDevice dev, VkDeviceMemory memory, const VkAllocationCallbacks *cb) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_live; i++) {
        if (live[i].memory != memory) continue;
        used_bytes -= live[i].size;
        live[i] = live[--n_live];
        break;
    }
    pthread_mutex_unlock(&lock);
    real_free(dev, memory, cb);
}

/* Our version of `name` (its real one kept), or NULL for a function we leave alone. */
static PFN_vkVoidFunction wrap(const char *name, PFN_vkVoidFunction real) {
#define WRAP(vk_name, slot, ours, type)          \
    if (!strcmp(name, vk_name)) {               \
        if (!real) return NULL;                 \
        slot = (type)real;                      \
        return (PFN_vkVoidFunction)ours;        \
    }
    WRAP("vkGetPhysicalDeviceMemoryProperties", real_props, props, PFN_vkGetPhysicalDeviceMemoryProperties)
    WRAP("vkGetPhysicalDeviceMemoryProperties2", real_props2, props2, PFN_vkGetPhysicalDeviceMemoryProperties2)
    WRAP("vkGetPhysicalDeviceMemoryProperties2KHR", real_props2, props2, PFN_vkGetPhysicalDeviceMemoryProperties2)
    WRAP("vkGetBufferMemoryRequirements", real_reqs, reqs, PFN_vkGetBufferMemoryRequirements)
    WRAP("vkGetBufferMemoryRequirements2", real_reqs2, reqs2, PFN_vkGetBufferMemoryRequirements2)
    WRAP("vkGetBufferMemoryRequirements2KHR", real_reqs2, reqs2, PFN_vkGetBufferMemoryRequirements2)
    WRAP("vkGetMemoryHostPointerPropertiesEXT", real_host_ptr, host_ptr, PFN_vkGetMemoryHostPointerPropertiesEXT)
    WRAP("vkAllocateMemory", real_alloc, alloc, PFN_vkAllocateMemory)
    WRAP("vkFreeMemory", real_free, release, PFN_vkFreeMemory)
#undef WRAP
    return real;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkGetDeviceProcAddr(VkDevice dev, const char *name) {
    if (!real_gdpa) real_gdpa = (PFN_vkGetDeviceProcAddr)dlsym(RTLD_NEXT, "vkGetDeviceProcAddr");
    if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)vkGetDeviceProcAddr;
    return wrap(name, real_gdpa(dev, name));
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL vkGetInstanceProcAddr(VkInstance inst, const char *name) {
    if (!real_gipa) real_gipa = (PFN_vkGetInstanceProcAddr)dlsym(RTLD_NEXT, "vkGetInstanceProcAddr");
    if (!strcmp(name, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)vkGetInstanceProcAddr;
    if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)vkGetDeviceProcAddr;
    return wrap(name, real_gipa(inst, name));
}

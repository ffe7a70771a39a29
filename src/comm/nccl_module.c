/*
 * nccl_module: the NCCL backend's calls (comm.h), forwarded to the module comm_nccl.c is built into,
 * loaded on the first call: next to the program (the build tree), else where it is installed
 * (<prefix>/lib/gradcheck-dist, relative to the program's directory). Only --backend nccl
 * calls them, so a CPU run loads neither CUDA nor NCCL: each rank's start is shorter by their loading
 * (measured in tests/bench), and a machine without them runs --backend mpi all the same.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"

#ifdef GCD_WITH_NCCL

#define MODULE "gradcheck-dist-nccl.so"

static const gcd_nccl_api *module(char *why, size_t len) {
    static const gcd_nccl_api *api;
    static char err[768];
    static int tried;
    if (!tried) {
        tried = 1;
        char path[PATH_MAX + 128] = "";
        ssize_t n = readlink("/proc/self/exe", path, PATH_MAX);
        char *slash = n > 0 ? (path[n] = 0, strrchr(path, '/')) : NULL;
        size_t room = slash ? sizeof path - (size_t)(slash + 1 - path) : 0;
        if (slash) snprintf(slash + 1, room, "%s", MODULE);
        if (slash && access(path, F_OK)) snprintf(slash + 1, room, "%s/%s", GCD_NCCL_MODULE_REL, MODULE);
        // global: CUDA and NCCL join the program's scope, where a test's LD_PRELOAD shim finds them (RTLD_NEXT)
        void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
        if (h) api = dlsym(h, "gcd_nccl_module");
        if (!api) snprintf(err, sizeof err, "cannot load the NCCL backend: %s", h ? "no gcd_nccl_module in it" : dlerror());
    }
    if (!api && why) snprintf(why, len, "%s", err);
    return api;
}

int gcd_nccl_built(void) { return 1; }

int gcd_cuda_device_count(char *why, size_t len) {
    const gcd_nccl_api *m = module(why, len);
    return m ? m->device_count(why, len) : -1;
}

gcd_comm *gcd_comm_nccl(gcd_comm *mpi, char *why, size_t len) {
    const gcd_nccl_api *m = module(why, len);
    return m ? m->comm(mpi, why, len) : NULL;
}

void gcd_comm_nccl_free(gcd_comm *c) {
    const gcd_nccl_api *m = module(NULL, 0);
    if (m) m->free(c);
}

void gcd_nccl_info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len) {
    const gcd_nccl_api *m = module(NULL, 0);
    if (m) m->info(c, nccl_version, cuda_version, device, len);
    else nccl_version[0] = cuda_version[0] = device[0] = 0;
}

#else

int gcd_nccl_built(void) { return 0; }

int gcd_cuda_device_count(char *why, size_t len) {
    snprintf(why, len, "this build has no CUDA");
    return -1;
}

gcd_comm *gcd_comm_nccl(gcd_comm *mpi, char *why, size_t len) {
    (void)mpi;
    snprintf(why, len, "this build has no NCCL backend (configure found no CUDA Toolkit with NCCL)");
    return NULL;
}

void gcd_comm_nccl_free(gcd_comm *c) { (void)c; }

void gcd_nccl_info(gcd_comm *c, char *nccl_version, char *cuda_version, char *device, size_t len) {
    (void)c, (void)len;
    nccl_version[0] = cuda_version[0] = device[0] = 0;
}

#endif

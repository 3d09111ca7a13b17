/* backend.c — picks a backend implementation by name ("cpu", "cuda", or a registered one). */
#include "kernels/backend.h"

#include <pthread.h>
#include <string.h>
#if defined(PLN_HAVE_CUDA) && !defined(PLN_CUDA_EMU)
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#endif

#define MAX_REGISTERED 8
static struct { const char *name; pln_backend *(*create)(int device); } g_reg[MAX_REGISTERED];
static int g_n_reg;
static pthread_mutex_t g_reg_lock = PTHREAD_MUTEX_INITIALIZER;

int pln_backend_register(const char *name, pln_backend *(*create)(int device)) {
    if (!name || !*name || !create) return pln_errorf("pln_backend_register: a name and a constructor are needed");
    if (!strcmp(name, "cpu") || !strcmp(name, "cuda"))
        return pln_errorf("pln_backend_register: \"%s\" is a built-in backend", name);
    pthread_mutex_lock(&g_reg_lock);
    int rc = 0;
    for (int i = 0; i < g_n_reg; i++)
        if (!strcmp(g_reg[i].name, name)) rc = pln_errorf("pln_backend_register: \"%s\" is registered already", name);
    if (!rc && g_n_reg == MAX_REGISTERED) rc = pln_errorf("pln_backend_register: %d backends are registered already", MAX_REGISTERED);
    if (!rc) { g_reg[g_n_reg].name = name; g_reg[g_n_reg].create = create; g_n_reg++; }
    pthread_mutex_unlock(&g_reg_lock);
    return rc;
}

#if defined(PLN_HAVE_CUDA) && !defined(PLN_CUDA_EMU)
/* The CUDA backend lives in libpollen-cuda.so beside the executable, so that the CPU path never
 * loads cudart, cuBLASLt and NCCL (0.2 s and 221 MB at start-up) and the binary runs on machines
 * without them. Binaries linked with the CUDA objects themselves (tests/gpu) resolve these weak
 * references at link time and never open the library. */
#pragma weak pln_backend_cuda_create
static void *g_cuda_lib;
static char *g_cuda_lib_path, *g_cuda_lib_why;   /* set when the library could not be opened */
static pthread_once_t g_cuda_lib_once = PTHREAD_ONCE_INIT;

static void cuda_lib_open(void) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) n = 0;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    char *path = slash ? pln_xasprintf("%.*s/%s", (int)(slash - exe), exe, PLN_CUDA_LIB_NAME)
                       : pln_xasprintf("./%s", PLN_CUDA_LIB_NAME);
    g_cuda_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_cuda_lib) { free(path); return; }
    const char *why = dlerror();
    g_cuda_lib_path = path;
    g_cuda_lib_why = pln_xstrdup(why ? why : "dlopen failed");
}

void *pln_cuda_lib_sym(const char *name) {
    pthread_once(&g_cuda_lib_once, cuda_lib_open);
    if (!g_cuda_lib) {
        pln_errorf("backend \"cuda\": the CUDA backend needs %s and the CUDA libraries it links (" PLN_CUDA_LIB_DEPS
                   "): %s; build it with `make` where nvcc exists and keep it beside the pollen binary, install the "
                   "CUDA runtime (or add its lib64 to LD_LIBRARY_PATH), or use --backend cpu",
                   g_cuda_lib_path, g_cuda_lib_why);
        return NULL;
    }
    void *p = dlsym(g_cuda_lib, name);
    if (!p) pln_errorf("backend \"cuda\": %s has no symbol %s: rebuild it with this pollen (`make`)", PLN_CUDA_LIB_NAME, name);
    return p;
}
#endif

pln_backend *pln_backend_create(const char *name, int device) {
    if (!name || !*name || !strcmp(name, "cpu"))
        return pln_backend_cpu_create();
    if (!strcmp(name, "cuda")) {
#if defined(PLN_HAVE_CUDA) && defined(PLN_CUDA_EMU)
        /* A strong reference: it pulls the CUDA backend's object out of the static library. */
        return pln_backend_cuda_create(device);
#elif defined(PLN_HAVE_CUDA)
        if (pln_backend_cuda_create) return pln_backend_cuda_create(device);
        pln_backend *(*create)(int) = (pln_backend * (*)(int)) pln_cuda_lib_sym("pln_backend_cuda_create");
        return create ? create(device) : NULL;
#else
        pln_errorf("backend \"cuda\": this build has no CUDA backend (nvcc was not found when it was "
                   "built); rebuild with `make CUDA=1` on a machine with the CUDA toolkit, or use "
                   "--backend cpu");
        return NULL;
#endif
    }
    pln_backend *(*create)(int) = NULL;
    pthread_mutex_lock(&g_reg_lock);
    for (int i = 0; i < g_n_reg; i++)
        if (!strcmp(g_reg[i].name, name)) create = g_reg[i].create;
    pthread_mutex_unlock(&g_reg_lock);
    if (create) return create(device);
    pln_errorf("backend \"%s\": unknown backend (known: cpu, cuda)", name);
    return NULL;
}

void pln_backend_destroy(pln_backend *be) {
    if (be && be->destroy) be->destroy(be);
}

int pln_backend_set_kv_dtype(pln_backend *be, pln_dtype dt) {
    if (!be) return pln_errorf("pln_backend_set_kv_dtype: no backend");
    if (be->kv_dtype == dt) return 0;
    if (!be->set_kv_dtype)
        return pln_errorf("backend \"%s\": the KV cache can only be %s here, not %s (use --kv-dtype %s)",
                          be->name, pln_kv_dtype_name(be->kv_dtype), pln_kv_dtype_name(dt),
                          pln_kv_dtype_name(be->kv_dtype));
    return be->set_kv_dtype(be, dt);
}

const char *pln_kv_dtype_name(pln_dtype dt) {
    return dt == PLN_DTYPE_F32 ? "f32" : dt == PLN_DTYPE_F16 ? "f16" : pln_dtype_name(dt);
}

int pln_kv_dtype_parse(const char *opt, const char *s, pln_dtype *out) {
    if (s && !strcmp(s, "f32")) { *out = PLN_DTYPE_F32; return 0; }
    if (s && !strcmp(s, "f16")) { *out = PLN_DTYPE_F16; return 0; }
    return pln_errorf("%s %s: not a KV-cache dtype (f32 or f16)", opt, s ? s : "(missing)");
}

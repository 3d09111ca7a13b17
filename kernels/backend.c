/* backend.c — picks a backend implementation by name ("cpu", "cuda", or a registered one). */
#include "kernels/backend.h"

#include <pthread.h>
#include <string.h>

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

pln_backend *pln_backend_create(const char *name, int device) {
    if (!name || !*name || !strcmp(name, "cpu"))
        return pln_backend_cpu_create();
    if (!strcmp(name, "cuda")) {
#ifdef PLN_HAVE_CUDA
        /* A strong reference: it pulls the CUDA backend's object out of the static library. */
        return pln_backend_cuda_create(device);
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

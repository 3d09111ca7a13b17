/* backend.c — picks a backend implementation by name ("cpu", "cuda"). */
#include "kernels/backend.h"

#include <string.h>

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
    pln_errorf("backend \"%s\": unknown backend (known: cpu, cuda)", name);
    return NULL;
}

void pln_backend_destroy(pln_backend *be) {
    if (be && be->destroy) be->destroy(be);
}

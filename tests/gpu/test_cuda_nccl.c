/* test_cuda_nccl.c — the NCCL wrapper on one GPU: a communicator of one rank made from a fresh
 * unique id, in-place all-reduce of F32 and F16 on the backend's stream (a sum over one rank is
 * the identity, bit for bit), and the error paths (short id, bad rank, unsupported dtype).
 * Several GPUs are exercised end to end by `mpirun -np N pollen generate --backend cuda`. */
#include "tests/test.h"
#include "kernels/backend.h"
#include "kernels/cuda/nccl.h"
#include "kernels/pln_math.h"

int main(void)
{
    test_begin("test_cuda_nccl");
    pln_backend *be = pln_backend_cuda_create(0);
    if (!be) { printf("SKIP: no GPU (%s)\n", pln_error()); return 77; }
    uint8_t id[PLN_NCCL_ID_BYTES];
    CHECK(pln_nccl_get_unique_id(id, 16) < 0, "a 16-byte buffer is refused");
    int n = pln_nccl_get_unique_id(id, sizeof id);
    CHECK(n == PLN_NCCL_ID_BYTES, "unique id: %d bytes (%s)", n, pln_error());
    CHECK(pln_nccl_create(0, 1, id, 10, be) == NULL, "a truncated id is refused");
    CHECK(pln_nccl_create(1, 1, id, sizeof id, be) == NULL, "rank 1 of 1 is refused");
    pln_nccl *c = pln_nccl_create(0, 1, id, sizeof id, be);
    CHECK(c != NULL, "communicator of one rank: %s", pln_error());
    if (c) {
        enum { N = 1000 };
        float hf[N], back[N];
        uint16_t hh[N], backh[N];
        for (int i = 0; i < N; i++) { hf[i] = (float)i * 0.25f - 7.0f; hh[i] = pln_f32_to_f16(hf[i]); }
        void *df = be->alloc(be, sizeof hf), *dh = be->alloc(be, sizeof hh);
        be->upload(be, df, hf, sizeof hf);
        be->upload(be, dh, hh, sizeof hh);
        CHECK(pln_nccl_allreduce(c, df, N, PLN_DTYPE_F32) == 0, "allreduce F32: %s", pln_error());
        CHECK(pln_nccl_allreduce(c, dh, N, PLN_DTYPE_F16) == 0, "allreduce F16: %s", pln_error());
        CHECK(pln_nccl_allreduce(c, df, 0, PLN_DTYPE_F32) == 0, "an empty allreduce is fine");
        CHECK(pln_nccl_allreduce(c, df, N, PLN_DTYPE_I8) != 0, "I8 is refused");
        be->download(be, back, df, sizeof back);
        be->download(be, backh, dh, sizeof backh);
        bool same = !memcmp(back, hf, sizeof hf) && !memcmp(backh, hh, sizeof hh);
        printf("nccl allreduce over 1 rank (F32, F16, in place on the backend stream): %s\n", same ? "OK" : "NOT OK");
        CHECK(same, "a sum over one rank must leave the data unchanged");
        be->free(be, df); be->free(be, dh);
        pln_nccl_destroy(c);
    }
    pln_nccl_destroy(NULL);
    be->destroy(be);
    return test_done();
}

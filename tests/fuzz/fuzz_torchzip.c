/* fuzz_torchzip.c — libFuzzer target: bytes that start like a zip go through the PyTorch zip
 * reader (libarchive directory walk, local headers, storages); anything else straight into the
 * safe unpickler. Accepted tensors' first and last bytes are read to check the bounds. */
#include "formats/torchzip.h"

#include <stdint.h>
#include <stddef.h>
#include <string.h>

static volatile uint64_t tz_sink;   /* keeps the bound-checking reads */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint64_t sum = 0;
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
        pln_torchzip tz;
        if (pln_torchzip_parse(&tz, data, size, "fuzz") != 0) return 0;
        for (int64_t i = 0; i < tz.n_tensors; i++) {
            const pln_tensor *t = &tz.tensors[i];
            if (t->nbytes) sum += t->data[0] + t->data[t->nbytes - 1];
        }
        pln_torchzip_close(&tz);
    } else {
        pln_pickle_tensor *t;
        int64_t n;
        if (pln_unpickle_state_dict(data, size, "fuzz", &t, &n) != 0) return 0;
        for (int64_t i = 0; i < n; i++) sum += strlen(t[i].name) + strlen(t[i].storage_key);
        pln_pickle_tensors_free(t, n);
    }
    tz_sink += sum;
    return 0;
}

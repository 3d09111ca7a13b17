/* fuzz_safetensors.c — libFuzzer target: any bytes through the safetensors validator, then every
 * accepted tensor's bytes are read (so a wrong bound shows up under ASan). */
#include "formats/safetensors.h"

#include <stdint.h>
#include <stddef.h>

static volatile uint64_t st_sink;   /* keeps the bound-checking reads */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    pln_safetensors st;
    if (pln_safetensors_parse(&st, data, size, "fuzz") != 0) return 0;
    uint64_t sum = 0;
    for (int64_t i = 0; i < st.n_tensors; i++) {
        const pln_tensor *t = &st.tensors[i];
        if (t->nbytes) sum += t->data[0] + t->data[t->nbytes - 1];
        if (pln_safetensors_find(&st, t->name) != t) __builtin_trap();
    }
    pln_safetensors_close(&st);
    st_sink += sum;
    return 0;
}

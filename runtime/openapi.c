/* openapi.c — docs/openapi.json built in with the assembler's .incbin (see openapi.h). The path
 * is relative to the repository root, where make compiles; the Makefile rebuilds this object
 * when the document changes. */
#include "runtime/openapi.h"

__asm__(".section .rodata\n"
        ".balign 16\n"
        ".globl pln_openapi_doc_start\n.hidden pln_openapi_doc_start\n"
        ".globl pln_openapi_doc_end\n.hidden pln_openapi_doc_end\n"
        "pln_openapi_doc_start:\n"
        ".incbin \"docs/openapi.json\"\n"
        "pln_openapi_doc_end:\n"
        ".byte 0\n"
        ".previous\n");

extern const char pln_openapi_doc_start[], pln_openapi_doc_end[];

const char *pln_openapi_json(size_t *len) {
    *len = (size_t)(pln_openapi_doc_end - pln_openapi_doc_start);
    return pln_openapi_doc_start;
}

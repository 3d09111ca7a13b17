/* openapi.h — docs/openapi.json, the OpenAPI 3 description of every route `pollen serve`
 * answers, built into the binary as it is in the repository (GET /openapi.json serves it
 * verbatim; tests/test_server.c checks it lists every route of pln_server_routes). */
#ifndef PLN_OPENAPI_H
#define PLN_OPENAPI_H

#include <stddef.h>

/* The document's bytes (NUL-terminated) and its length. */
const char *pln_openapi_json(size_t *len);

#endif

/* server.h — the HTTP front of `pollen serve` on rank 0: TGI routes (/generate,
 * /generate_stream, /tokenize, /health, /info, /metrics) and OpenAI routes (/v1/completions,
 * /v1/chat/completions, /v1/models, /v1/models/{id}) over libmicrohttpd, one thread per connection. Request bodies are validated by
 * httpreq, tokenized here, and handed to the scheduler as jobs; responses are JSON or
 * server-sent events. docs/SERVING.md documents every route. */
#ifndef PLN_SERVER_H
#define PLN_SERVER_H

#include "runtime/httpreq.h"
#include "runtime/scheduler.h"
#include <stdint.h>
#include <stdio.h>

typedef struct {
    const char *host;          /* address to bind (default "127.0.0.1") */
    int port;                  /* 0: any free port (read it back with pln_server_port) */
    const char *model_id;      /* name reported by /info and /v1/models, checked against "model" */
    const char *const *served_names;  /* more names the OpenAI routes accept and /v1/models lists
                                         (--served-model-name A,B); copied */
    int n_served_names;
    pln_serve_limits lim;
    const pln_chat_template *chat_template;   /* borrowed; NULL: /v1/chat/completions explains why not */
    const char *api_key;       /* --api-key: the protected routes need "Authorization: Bearer KEY"
                                  (NULL or "": no key); copied */
    bool no_request_log;       /* --log-requests off: no line per request */
    bool log_json;             /* --log-format json: one JSON object per line */
    FILE *log;                 /* where request lines go (NULL: stderr) */
} pln_server_opts;

/* One route the server answers: GET routes answer HEAD as well (same status and headers, no
 * body). `auth`: needs the API key when one is set. The path of a route with a parameter is
 * written as OpenAPI writes it ("/v1/models/{model}"). docs/openapi.json lists every one. */
typedef struct {
    const char *method, *path;
    bool auth;
} pln_route_info;
const pln_route_info *pln_server_routes(int *n);

typedef struct pln_server pln_server;

/* Starts listening (the scheduler and tokenizer are borrowed and must outlive the server).
 * NULL + error when the address cannot be bound. */
pln_server *pln_server_start(const pln_server_opts *o, pln_sched *sched, const pln_sched_tok *tok);
int pln_server_port(const pln_server *s);
/* Responses still being written (streams included). */
int pln_server_open_responses(pln_server *s);
/* Connections libmicrohttpd holds, whatever they have sent (pln_client_connections); a closed one
 * leaves the count only after its place under the per-client limit is free. */
int pln_server_client_connections(pln_server *s);
/* Waits up to grace_s for open responses to finish, then closes every connection and frees. */
void pln_server_stop(pln_server *s, double grace_s);

#endif

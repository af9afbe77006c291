/*
 * generate: one answer from a model through tandem's C API.
 *
 *   cargo build --release -p tandem-capi
 *   cc -O2 -Iinclude examples/c/generate.c target/release/libtandem.a -lm -lpthread -ldl -o generate
 *   ./generate -n 64 "Why is the sky blue?"
 *
 * Prints the answer on stdout (greedy unless --temp is given: the same text
 * as `tandem -p PROMPT --temp 0 -n 64`) and the statistics on stderr.
 *
 * Options: -m MODEL (file or catalogue name), -d DRAFTER (support file),
 * --lookup, -n TOKENS, -t THREADS, -c CTX, --temp T, --seed S, --raw (the
 * prompt as is, without the chat template).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

static int fail(const char *what) {
    fprintf(stderr, "error: %s: %s\n", what, tandem_last_error());
    return 1;
}

/* Print each piece as it comes. */
static int on_token(uint32_t id, const char *piece, size_t len, void *user_data) {
    (void)id;
    (void)user_data;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    tandem_engine_options opts = tandem_engine_options_default();
    tandem_generate_params params = tandem_generate_params_default();
    const char *prompt = NULL;
    int raw = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) { opts.model = v; i++; }
        else if (!strcmp(a, "-d") && v) { opts.drafter = v; i++; }
        else if (!strcmp(a, "--lookup")) { opts.lookup = true; }
        else if (!strcmp(a, "-n") && v) { params.max_tokens = (uint32_t)atoi(v); i++; }
        else if (!strcmp(a, "-t") && v) { opts.threads = (uint32_t)atoi(v); i++; }
        else if (!strcmp(a, "-c") && v) { opts.ctx = (uint32_t)atoi(v); i++; }
        else if (!strcmp(a, "--temp") && v) { params.temperature = (float)atof(v); i++; }
        else if (!strcmp(a, "--seed") && v) { params.seed = strtoull(v, NULL, 10); i++; }
        else if (!strcmp(a, "--raw")) { raw = 1; }
        else if (a[0] == '-' && a[1] != '\0') { fprintf(stderr, "unknown option %s\n", a); return 2; }
        else { prompt = a; }
    }
    if (!prompt) {
        fprintf(stderr, "usage: %s [-m MODEL] [-d DRAFTER] [--lookup] [-n N] [-t T] [-c CTX] [--temp T] [--seed S] [--raw] PROMPT\n", argv[0]);
        return 2;
    }

    tandem_engine *engine = NULL;
    if (tandem_engine_open(&opts, &engine) != TANDEM_OK) return fail("opening the engine");

    /* The chat template turns the prompt into the model's conversation format. */
    char *text = NULL;
    if (raw) {
        text = malloc(strlen(prompt) + 1);
        strcpy(text, prompt);
    } else {
        tandem_message msg = {"user", prompt};
        size_t len = 0;
        tandem_chat_render(engine, &msg, 1, NULL, 0, &len); /* asks for the length */
        text = malloc(len + 1);
        if (tandem_chat_render(engine, &msg, 1, text, len + 1, &len) != TANDEM_OK) return fail("rendering the chat");
    }

    size_t n = 0;
    tandem_tokenize(engine, text, NULL, 0, &n);
    uint32_t *ids = malloc(n * sizeof *ids);
    if (tandem_tokenize(engine, text, ids, n, &n) != TANDEM_OK) return fail("tokenizing");

    tandem_session *session = NULL;
    if (tandem_session_new(engine, &session) != TANDEM_OK) return fail("creating a session");
    tandem_stats stats;
    if (tandem_session_generate(session, ids, n, &params, on_token, NULL, &stats) != TANDEM_OK) return fail("generating");
    printf("\n");

    fprintf(stderr, "[prompt tokens: %zu, generated: %zu, prefill %.1f ms, decode %.1f ms",
            stats.prompt_tokens, stats.generated_tokens, stats.prefill_ms, stats.decode_ms);
    if (stats.cycles > 0)
        fprintf(stderr, ", %llu cycles, %llu of %llu drafts accepted",
                (unsigned long long)stats.cycles, (unsigned long long)stats.accepted, (unsigned long long)stats.drafted);
    fprintf(stderr, "]\n");

    tandem_session_free(session);
    tandem_engine_free(engine);
    free(ids);
    free(text);
    return 0;
}

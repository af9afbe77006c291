/*
 * tandem: exact speculative decoding on the CPU, as a C library.
 *
 * Generated from crates/capi by cbindgen; do not edit. Regenerate with
 *   TANDEM_BLESS=1 cargo test -p tandem-capi --test header
 *
 * Every function returns a tandem_status (TANDEM_OK is 0) unless it says
 * otherwise; on failure tandem_last_error() gives the message. Handles are
 * checked before use: NULL, freed or foreign handles are refused with
 * TANDEM_ERR_INVALID_HANDLE, never dereferenced.
 */

#ifndef TANDEM_H
#define TANDEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// The id given with text that belongs to no single token.
#define TANDEM_TOKEN_NONE UINT32_MAX

// What a call returned. `TANDEM_OK` is 0; every other value is a failure
// whose message `tandem_last_error()` gives.
typedef enum tandem_status {
  TANDEM_OK = 0,
  // An argument is NULL where it may not be, out of range, or not UTF-8.
  TANDEM_ERR_INVALID_ARGUMENT = 1,
  // A handle is NULL, already freed, or of another kind.
  TANDEM_ERR_INVALID_HANDLE = 2,
  // An output buffer is too small; the length it needs was written.
  TANDEM_ERR_BUFFER_TOO_SMALL = 3,
  // A model or support file is missing, unreadable or malformed, or a
  // catalogue model could not be fetched.
  TANDEM_ERR_MODEL = 4,
  // The prompt and the generation do not fit the session's context.
  TANDEM_ERR_CONTEXT = 5,
  // Speculative settings that are out of range or do not go together.
  TANDEM_ERR_SPECULATION = 6,
  // The session is in use by another call (another thread, or a token
  // callback calling back into its own session).
  TANDEM_ERR_BUSY = 7,
  // A bug in tandem: a panic was caught at the boundary.
  TANDEM_ERR_INTERNAL = 8,
} tandem_status;

// Why a generation ended.
typedef enum tandem_stop {
  // An end-of-generation token.
  TANDEM_STOP_EOG = 0,
  // `max_tokens` reached.
  TANDEM_STOP_LENGTH = 1,
  // The session's context is full.
  TANDEM_STOP_CONTEXT = 2,
  // The token callback returned non-zero.
  TANDEM_STOP_CALLBACK = 3,
} tandem_stop;

// An open engine (a model, its tokenizer, threads and speculation settings).
typedef struct tandem_engine tandem_engine;

// A conversation: a KV cache, the tokens it holds, and drafter state.
typedef struct tandem_session tandem_session;

// A saved session state.
typedef struct tandem_snapshot tandem_snapshot;

// How to open an engine. Start from `tandem_engine_options_default()`.
typedef struct tandem_engine_options {
  // A GGUF file, or a catalogue name such as "smollm2-135m" or
  // "qwen2.5-coder-0.5b" (fetched on first use). NULL: the default model.
  const char *model;
  // Worker threads; 0: the physical cores.
  uint32_t threads;
  // Context of each session in tokens; 0: the model's training context.
  uint32_t ctx;
  // A support file to draft with (an MTP head or a DSpark drafter, used as
  // its kind says). NULL: none.
  const char *drafter;
  // Draft with n-gram prompt lookup (with a drafter: in front of it).
  bool lookup;
  // Most tokens drafted per cycle; 0: the drafter's default.
  uint32_t max_draft;
  // Fetch a catalogue model that is not in the models directory yet
  // (`$TANDEM_MODELS_DIR`); false: such a model is an error.
  bool fetch;
} tandem_engine_options;

// How to generate. Start from `tandem_generate_params_default()`.
typedef struct tandem_generate_params {
  // Most tokens to generate.
  uint32_t max_tokens;
  // 0: greedy (argmax); otherwise sample at this temperature.
  float temperature;
  // Keep the k most likely tokens; 0: all.
  uint32_t top_k;
  // Keep the smallest set of tokens whose probability reaches top_p; 1: all.
  float top_p;
  // Drop tokens less likely than min_p times the most likely; 0: none.
  float min_p;
  // Seed of the sampler's random numbers.
  uint64_t seed;
  // Speculate with the engine's drafter (when it has one). Greedy output
  // and the sampled distribution are the same either way.
  bool speculative;
} tandem_generate_params;

// One chat message.
typedef struct tandem_message {
  // "system", "user" or "assistant".
  const char *role;
  const char *content;
} tandem_message;

// Receives each generated token and its text (never half a UTF-8
// character; `piece` is NUL-terminated and `len` bytes long). Returns 0 to
// go on, anything else to stop. The text held back at the end comes with
// `id` = `TANDEM_TOKEN_NONE`.
typedef int (*tandem_token_callback)(uint32_t id, const char *piece, size_t len, void *user_data);

// What one generation did.
typedef struct tandem_stats {
  // Tokens in the prompt.
  size_t prompt_tokens;
  // Prompt tokens evaluated (the rest were already in the session).
  size_t prefill_tokens;
  // Tokens generated (an end-of-generation token included).
  size_t generated_tokens;
  double prefill_ms;
  double decode_ms;
  enum tandem_stop stop;
  // Speculative cycles (0 without speculation).
  uint64_t cycles;
  // Draft tokens verified by the target.
  uint64_t drafted;
  // Draft tokens the target agreed with.
  uint64_t accepted;
} tandem_stats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The library's version ("0.1.0"), a static string.
const char *tandem_version(void);

// The message of this thread's last failed call ("" before any). Valid
// until the next failing call on the same thread.
const char *tandem_last_error(void);

// Default engine options: the default model, all physical cores, the
// model's context, no drafter, fetching allowed.
struct tandem_engine_options tandem_engine_options_default(void);

// Default generation parameters: 256 tokens, greedy, speculative.
struct tandem_generate_params tandem_generate_params_default(void);

// Load a model and check its speculation settings (a drafter that cannot
// be used is an error, not a fallback).
//
// # Safety
// `options` is NULL (the defaults) or points to a `tandem_engine_options`
// whose strings are NULL or NUL-terminated; `out` is valid for one write.
enum tandem_status tandem_engine_open(const struct tandem_engine_options *options,
                                      struct tandem_engine **out);

// Close an engine. Its sessions keep working until they are freed. NULL
// is accepted and does nothing.
enum tandem_status tandem_engine_free(struct tandem_engine *engine);

// The context of the engine's sessions, in tokens.
//
// # Safety
// `ctx` is valid for one write.
enum tandem_status tandem_engine_ctx(const struct tandem_engine *engine, size_t *ctx);

// Tokenize text as a prompt: special tokens such as `<|im_start|>` are
// parsed, and BOS is added when the model wants it. Writes up to `cap` ids
// and the count in `n_out` (the count needed when it returns
// `TANDEM_ERR_BUFFER_TOO_SMALL`).
//
// # Safety
// `text` is NUL-terminated; `ids` is valid for `cap` writes (or NULL with
// `cap` 0); `n_out` is valid for one write.
enum tandem_status tandem_tokenize(const struct tandem_engine *engine,
                                   const char *text,
                                   uint32_t *ids,
                                   size_t cap,
                                   size_t *n_out);

// The text of `n` token ids, NUL-terminated, into `buf` of `cap` bytes;
// `len_out` gets its length without the NUL (the length needed when it
// returns `TANDEM_ERR_BUFFER_TOO_SMALL`).
//
// # Safety
// `ids` holds `n` ids (or is NULL with `n` 0); `buf` is valid for `cap`
// writes (or NULL with `cap` 0); `len_out` is valid for one write.
enum tandem_status tandem_detokenize(const struct tandem_engine *engine,
                                     const uint32_t *ids,
                                     size_t n,
                                     char *buf,
                                     size_t cap,
                                     size_t *len_out);

// Render a conversation with the model's chat template, ready for the
// assistant's answer (what `tandem -p` does to its prompt). Output as
// `tandem_detokenize`.
//
// # Safety
// `messages` holds `n` messages whose strings are NUL-terminated; `buf` and
// `len_out` as in `tandem_detokenize`.
enum tandem_status tandem_chat_render(const struct tandem_engine *engine,
                                      const struct tandem_message *messages,
                                      size_t n,
                                      char *buf,
                                      size_t cap,
                                      size_t *len_out);

// Start a conversation with the engine's context and drafter.
//
// # Safety
// `out` is valid for one write.
enum tandem_status tandem_session_new(const struct tandem_engine *engine,
                                      struct tandem_session **out);

// Free a session. NULL is accepted and does nothing.
enum tandem_status tandem_session_free(struct tandem_session *session);

// Generate after `prompt` (token ids; the session reuses what it already
// holds of them and evaluates the rest). Each token goes to `callback`
// (may be NULL); `stats` (may be NULL) receives counts, timings and the
// speculative cycles of this call.
//
// # Safety
// `prompt` holds `n` ids; `params` is NULL (the defaults) or valid;
// `callback`, if given, is safe to call with `user_data`; `stats` is NULL
// or valid for one write.
enum tandem_status tandem_session_generate(struct tandem_session *session,
                                           const uint32_t *prompt,
                                           size_t n,
                                           const struct tandem_generate_params *params,
                                           tandem_token_callback callback,
                                           void *user_data,
                                           struct tandem_stats *stats);

// How many tokens the session holds.
//
// # Safety
// `n_out` is valid for one write.
enum tandem_status tandem_session_n_tokens(const struct tandem_session *session, size_t *n_out);

// The tokens the session holds (prompt and generated), as
// `tandem_tokenize` writes ids.
//
// # Safety
// `ids` is valid for `cap` writes (or NULL with `cap` 0); `n_out` for one.
enum tandem_status tandem_session_tokens(const struct tandem_session *session,
                                         uint32_t *ids,
                                         size_t cap,
                                         size_t *n_out);

// Keep the first `n` tokens and forget the rest (exact: decoding after it
// gives the bits it gave when the session held `n` tokens). `n` beyond the
// session's length changes nothing.
enum tandem_status tandem_session_truncate(struct tandem_session *session, size_t n);

// Save the session's state (its cache rows, tokens and last logits).
//
// # Safety
// `out` is valid for one write.
enum tandem_status tandem_session_snapshot(const struct tandem_session *session,
                                           struct tandem_snapshot **out);

// Return a session to a saved state (a snapshot of any session of the same
// engine). The snapshot stays valid.
enum tandem_status tandem_session_restore(struct tandem_session *session,
                                          const struct tandem_snapshot *snapshot);

// Free a snapshot. NULL is accepted and does nothing.
enum tandem_status tandem_snapshot_free(struct tandem_snapshot *snapshot);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* TANDEM_H */

// moeplace-routing: record which experts llama.cpp's own graph routes each token to.
//
// Loads a GGUF on the CPU, evaluates a prompt (logits for every token, so that the last layer
// routes every row rather than only the output row) and then generates -n tokens greedily one at
// a time. An eval callback copies the tensors named "ffn_moe_topk-<layer>" (the expert ids that
// build_moe_ffn selects: in this llama.cpp a strided I32 view of "ffn_moe_argsort") out of the
// graph. Greedy decoding skips end-of-generation tokens so that the trace always has -n
// generated rows.
//
// Output (-o, default stdout), plain text:
//   moeplace-routing 1
//   <n_layer> <n_expert> <n_expert_used> <n_prompt> <n_tokens>
//   <token> <layer> <id_1> ... <id_k>        one line per (token, routed layer), token-major
//
// Exit status is non-zero, with a one-line reason on stderr, on any failure.

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "moeplace-routing: error: %s\n", msg.c_str());
    std::exit(1);
}

struct Recorder {
    int64_t n_expert = 0;
    int64_t n_expert_used = 0;
    int64_t expected_rows = 0;              // tokens in the batch being decoded (one ubatch)
    std::map<int, std::vector<int32_t>> ids;  // layer -> ids, token-major, n_expert_used per token
    std::vector<int32_t> scratch;
    std::string error;                      // first failure seen inside the callback
    bool verify = false;                    // also check the ids against the scores they were selected from
    std::map<int, std::vector<float>> scores;  // layer -> the selection scores of the current ubatch
    int64_t verified_rows = 0;
};

const char * const PREFIX = "ffn_moe_topk-";
// What build_moe_ffn ranks to select the experts, latest wins (biased: DeepSeek V3 style; masked: expert groups).
const char * const SCORE_PREFIXES[] = {"ffn_moe_probs-", "ffn_moe_probs_biased-", "ffn_moe_probs_masked-"};

bool has_prefix(const ggml_tensor * t, const char * prefix, int * layer) {
    const size_t n = std::strlen(prefix);
    if (std::strncmp(t->name, prefix, n) != 0) {
        return false;
    }
    char * end = nullptr;
    errno = 0;
    const long il = std::strtol(t->name + n, &end, 10);
    if (errno != 0 || end == t->name + n || *end != '\0' || il < 0 || il > 100000) {
        return false;
    }
    *layer = static_cast<int>(il);
    return true;
}

bool is_topk(const ggml_tensor * t, int * layer) {
    return has_prefix(t, PREFIX, layer);
}

bool is_score(const ggml_tensor * t, int * layer) {
    for (const char * prefix : SCORE_PREFIXES) {
        if (has_prefix(t, prefix, layer)) {
            return true;
        }
    }
    return false;
}

// --verify: every selected expert must score at least as high as every expert left out.
void check_selection(Recorder * rec, const ggml_tensor * t, int layer, const int32_t * ids, int64_t row) {
    auto it = rec->scores.find(layer);
    if (it == rec->scores.end()) {
        rec->error = std::string("--verify: no ffn_moe_probs tensor came before ") + t->name;
        return;
    }
    const float * s = it->second.data() + row * rec->n_expert;
    float lowest_in = INFINITY;
    std::vector<bool> chosen(rec->n_expert, false);
    for (int64_t j = 0; j < rec->n_expert_used; j++) {
        chosen[ids[j]] = true;
        lowest_in = std::min(lowest_in, s[ids[j]]);
    }
    for (int64_t e = 0; e < rec->n_expert; e++) {
        if (!chosen[e] && s[e] > lowest_in) {
            std::ostringstream err;
            err << t->name << " row " << row << " selects experts whose lowest score is " << lowest_in
                << " but leaves out expert " << e << " scoring " << s[e] << " (ids read wrongly?)";
            rec->error = err.str();
            return;
        }
    }
    rec->verified_rows++;
}

bool keep_scores(Recorder * rec, ggml_tensor * t, int layer) {
    if (t->type != GGML_TYPE_F32 || t->ne[0] != rec->n_expert || t->ne[1] != rec->expected_rows ||
        !ggml_is_contiguous(t)) {
        rec->error = std::string(t->name) + " is not a contiguous f32 [n_expert, tokens] tensor; cannot --verify";
        return false;
    }
    auto & s = rec->scores[layer];
    s.resize(static_cast<size_t>(t->ne[0] * t->ne[1]));
    ggml_backend_tensor_get(t, s.data(), 0, s.size() * sizeof(float));
    return true;
}

bool on_eval(ggml_tensor * t, bool ask, void * user_data) {
    auto * rec = static_cast<Recorder *>(user_data);
    int layer = -1;
    if (rec->verify && is_score(t, &layer)) {
        return ask ? true : keep_scores(rec, t, layer);
    }
    if (!is_topk(t, &layer)) {
        return ask ? false : true;
    }
    if (ask) {
        return true;
    }
    if (!rec->error.empty()) {
        return false;
    }
    std::ostringstream err;
    if (t->type != GGML_TYPE_I32) {
        err << t->name << " has type " << ggml_type_name(t->type) << ", expected i32 expert ids";
    } else if (t->ne[0] != rec->n_expert_used) {
        err << t->name << " has " << t->ne[0] << " ids per token, expected n_expert_used = " << rec->n_expert_used;
    } else if (t->ne[1] != rec->expected_rows || t->ne[2] != 1 || t->ne[3] != 1) {
        err << t->name << " has shape [" << t->ne[0] << ", " << t->ne[1] << ", " << t->ne[2] << ", " << t->ne[3]
            << "], expected " << rec->expected_rows << " token rows";
    } else if (t->nb[0] != sizeof(int32_t) || t->nb[1] % sizeof(int32_t) != 0 ||
               t->nb[1] < static_cast<size_t>(t->ne[0]) * sizeof(int32_t)) {
        err << t->name << " has unexpected strides nb0=" << t->nb[0] << " nb1=" << t->nb[1];
    } else if (t->buffer == nullptr && (t->view_src == nullptr || t->view_src->buffer == nullptr)) {
        err << t->name << " has no backend buffer";
    }
    if (err.tellp() > 0) {
        rec->error = err.str();
        return false;  // cancels the graph compute; main() reports the error
    }
    // The view spans (ne1-1)*nb1 + ne0*4 bytes of its source: read them and pick each row's first ne0 ids.
    const size_t nbytes = ggml_nbytes(t);
    rec->scratch.resize((nbytes + sizeof(int32_t) - 1) / sizeof(int32_t));
    ggml_backend_tensor_get(t, rec->scratch.data(), 0, nbytes);
    const size_t row_stride = t->nb[1] / sizeof(int32_t);
    auto & out = rec->ids[layer];
    for (int64_t r = 0; r < t->ne[1]; r++) {
        const int32_t * row = rec->scratch.data() + r * row_stride;
        for (int64_t j = 0; j < t->ne[0]; j++) {
            if (row[j] < 0 || row[j] >= rec->n_expert) {
                err << t->name << " row " << r << " holds expert id " << row[j] << ", outside [0, " << rec->n_expert
                    << ")";
                rec->error = err.str();
                return false;
            }
            out.push_back(row[j]);
        }
        if (rec->verify) {
            check_selection(rec, t, layer, row, r);
            if (!rec->error.empty()) {
                return false;
            }
        }
    }
    return true;
}

std::string meta(const llama_model * model, const std::string & key) {
    char buf[256];
    const int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
    return n < 0 ? std::string() : std::string(buf);
}

int64_t meta_int(const llama_model * model, const std::string & key) {
    const std::string v = meta(model, key);
    if (v.empty()) {
        die("the model has no metadata key " + key + " (not a mixture-of-experts model?)");
    }
    char * end = nullptr;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    if (*end != '\0' || x <= 0) {
        die("metadata " + key + " = '" + v + "' is not a positive integer");
    }
    return x;
}

void log_filter(ggml_log_level level, const char * text, void *) {
    if (level != GGML_LOG_LEVEL_DEBUG) {
        std::fputs(text, stderr);
    }
}

void usage() {
    std::fprintf(stderr,
                 "usage: moeplace-routing -m model.gguf -f prompt.txt [-n gen_tokens] [-t threads] [-c n_ctx] "
                 "[-b n_batch] [-o out.txt] [--verify]\n");
    std::exit(2);
}

long parse_long(const char * flag, const char * s, long lo) {
    char * end = nullptr;
    errno = 0;
    const long v = std::strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo) {
        die(std::string(flag) + " needs an integer >= " + std::to_string(lo) + ", got '" + s + "'");
    }
    return v;
}

}  // namespace

int main(int argc, char ** argv) {
    std::string model_path, prompt_path, out_path;
    Recorder rec;
    long n_gen = 16, threads = 2, n_ctx = 0, n_batch = 512;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--verify") {
            rec.verify = true;
            continue;
        }
        if (i + 1 >= argc) {
            usage();
        }
        const char * v = argv[++i];
        if (a == "-m") {
            model_path = v;
        } else if (a == "-f") {
            prompt_path = v;
        } else if (a == "-o") {
            out_path = v;
        } else if (a == "-n") {
            n_gen = parse_long("-n", v, 0);
        } else if (a == "-t") {
            threads = parse_long("-t", v, 1);
        } else if (a == "-c") {
            n_ctx = parse_long("-c", v, 0);
        } else if (a == "-b") {
            n_batch = parse_long("-b", v, 1);
        } else {
            usage();
        }
    }
    if (model_path.empty() || prompt_path.empty()) {
        usage();
    }

    std::ifstream pf(prompt_path, std::ios::binary);
    if (!pf) {
        die("cannot read the prompt file " + prompt_path);
    }
    const std::string prompt((std::istreambuf_iterator<char>(pf)), std::istreambuf_iterator<char>());

    llama_log_set(log_filter, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path.c_str(), mparams);
    if (model == nullptr) {
        die("cannot load the model " + model_path + " (llama.cpp says why earlier in the log)");
    }
    const std::string arch = meta(model, "general.architecture");
    rec.n_expert = meta_int(model, arch + ".expert_count");
    rec.n_expert_used = meta_int(model, arch + ".expert_used_count");
    const int n_layer = llama_model_n_layer(model);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    // Tokenize.
    std::vector<llama_token> tokens(prompt.size() + 16);
    int n_prompt = llama_tokenize(vocab, prompt.data(), static_cast<int32_t>(prompt.size()), tokens.data(),
                                  static_cast<int32_t>(tokens.size()), true, false);
    if (n_prompt < 0) {
        if (n_prompt == INT32_MIN) {
            die("the prompt is too long to tokenize");
        }
        tokens.resize(-n_prompt);
        n_prompt = llama_tokenize(vocab, prompt.data(), static_cast<int32_t>(prompt.size()), tokens.data(),
                                  static_cast<int32_t>(tokens.size()), true, false);
    }
    if (n_prompt <= 0) {
        die("the prompt tokenized to no tokens");
    }
    tokens.resize(n_prompt);
    const long n_total = n_prompt + n_gen;
    if (n_ctx == 0) {
        n_ctx = n_total;
    }
    if (n_total > n_ctx) {
        die("prompt (" + std::to_string(n_prompt) + " tokens) + " + std::to_string(n_gen) +
            " generated tokens exceed the context -c " + std::to_string(n_ctx));
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = static_cast<uint32_t>(n_ctx);
    cparams.n_batch = static_cast<uint32_t>(n_batch);
    cparams.n_ubatch = static_cast<uint32_t>(n_batch);  // one llama_decode call = one ubatch = one graph
    cparams.n_seq_max = 1;
    cparams.n_threads = static_cast<int32_t>(threads);
    cparams.n_threads_batch = static_cast<int32_t>(threads);
    cparams.cb_eval = on_eval;
    cparams.cb_eval_user_data = &rec;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        die("cannot create a llama.cpp context (llama.cpp says why earlier in the log)");
    }

    // llama.cpp may lower n_batch/n_ubatch (e.g. to n_ctx): chunk by what it really uses.
    n_batch = std::min<long>(llama_n_batch(ctx), llama_n_ubatch(ctx));
    llama_batch batch = llama_batch_init(static_cast<int32_t>(n_batch), 0, 1);
    long pos = 0;
    // Decode tokens[from, from+n) as one batch with logits for every token; check the routing of every row came out.
    auto decode = [&](const llama_token * toks, long n) {
        batch.n_tokens = static_cast<int32_t>(n);
        for (long i = 0; i < n; i++) {
            batch.token[i] = toks[i];
            batch.pos[i] = static_cast<llama_pos>(pos + i);
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        rec.expected_rows = n;
        rec.scores.clear();
        const int32_t rc = llama_decode(ctx, batch);
        if (!rec.error.empty()) {
            die(rec.error);
        }
        if (rc != 0) {
            die("llama_decode failed (status " + std::to_string(rc) + ") at position " + std::to_string(pos));
        }
        pos += n;
        if (rec.ids.empty()) {
            die("the graph has no ffn_moe_topk tensors: this model does not route tokens to experts");
        }
        for (const auto & kv : rec.ids) {
            if (static_cast<long>(kv.second.size()) != pos * rec.n_expert_used) {
                die("layer " + std::to_string(kv.first) + " routed " +
                    std::to_string(kv.second.size() / rec.n_expert_used) + " tokens, expected " + std::to_string(pos) +
                    " (a layer skipped rows?)");
            }
        }
    };

    for (long i = 0; i < n_prompt; i += n_batch) {
        decode(tokens.data() + i, std::min<long>(n_batch, n_prompt - i));
    }
    for (long g = 0; g < n_gen; g++) {
        const float * logits = llama_get_logits_ith(ctx, -1);
        if (logits == nullptr) {
            die("no logits for the last token");
        }
        llama_token best = -1;
        for (llama_token t = 0; t < n_vocab; t++) {
            if (llama_vocab_is_eog(vocab, t)) {
                continue;
            }
            if (best < 0 || logits[t] > logits[best]) {
                best = t;
            }
        }
        if (best < 0) {
            die("every vocabulary token is an end-of-generation token");
        }
        decode(&best, 1);
    }

    std::ostringstream os;
    os << "moeplace-routing 1\n";
    os << n_layer << ' ' << rec.n_expert << ' ' << rec.n_expert_used << ' ' << n_prompt << ' ' << pos << '\n';
    const int64_t k = rec.n_expert_used;
    for (long tok = 0; tok < pos; tok++) {
        for (const auto & kv : rec.ids) {
            os << tok << ' ' << kv.first;
            for (int64_t j = 0; j < k; j++) {
                os << ' ' << kv.second[tok * k + j];
            }
            os << '\n';
        }
    }
    const std::string text = os.str();
    if (out_path.empty()) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        if (std::fflush(stdout) != 0) {
            die("cannot write the trace to stdout");
        }
    } else {
        std::FILE * f = std::fopen(out_path.c_str(), "wb");
        if (f == nullptr || std::fwrite(text.data(), 1, text.size(), f) != text.size() || std::fclose(f) != 0) {
            die("cannot write the trace to " + out_path);
        }
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    if (rec.verify) {
        std::fprintf(stderr, "moeplace-routing: --verify: %lld (token, layer) selections checked against their scores\n",
                     static_cast<long long>(rec.verified_rows));
    }
    return 0;
}

#include "worker/setup/model_setup_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chunk_mac.h"
#include "common/status_macros.h"

namespace lazykv {

namespace {
constexpr char kUsage[] =
    R"(  --model PATH|synthetic:NAME  llama2.c .bin, Hugging Face directory, or synthetic weights
  --tokenizer PATH       tokenizer.json (Hugging Face byte-level BPE), llama2.c tokenizer.bin or
                         SentencePiece .model (default: next to the model)
  --mode MODE            none | prefix | block | lazy (default lazy)
  --device D             cpu | cuda | auto (default auto: cuda when this build has it and a GPU is present)
  --dtype T              bf16 | fp32 | auto: the precision of weights, activations between GEMMs and KV
                         (default auto: bf16 on cuda, fp32 on cpu; bf16 on cpu rounds where cuda does)
  --shared-decode S      auto | always | off: decode attention reads KV blocks that several
                         sequences of a batch share (a document's chunk) once for all of them
                         (cuda; default auto: when that saves at least a fifth of the reads)
  --block-size N         KV block size in tokens (default 16)
  --kv-pool BYTES        KV pool size (default 256MiB)
  --max-prefill-tokens N prefill tokens per scheduling step (default 512)
  --cache-servers LIST   share chunk KV through cache servers HOST:PORT,... (lazykv-cache-server)
  --cache-min-deadline-ms N  floor of a cache server call's deadline, otherwise set from the
                         server's observed latency (default 20; 5x before the first answer); a
                         server that misses one is skipped until it answers a health check
  --cache-lookup-lease-ms N  a lookup of a cache server on this host leases what it finds there,
                         so that the fetch after it reads in place with no call; a lease no fetch
                         took within N ms is released (default 2000; 0: lookups lease nothing)
  --transport T          auto | grpc | shm | nccl: how chunks come from the cache servers; auto
                         (default) reads a server on this host in place from its shared host RAM
                         (shm) and streams from the others over gRPC; a chunk in a server's GPU
                         tier comes device to device (CUDA IPC where this GPU can open it, else
                         an NCCL link); nccl: GPU-tier chunks over NCCL links, never CUDA IPC
  --cache-dir DIR        without --cache-servers: the embedded cache tier's RocksDB directory
                         (default $LAZYKV_CACHE_DIR, $XDG_CACHE_HOME/lazykv or ~/.cache/lazykv)
  --cache-host-capacity B  embedded tier's host RAM (default 256MiB)
  --cache-disk-capacity B  embedded tier's disk (default 2GiB)
  --no-cache-tier        the local KV pool only
  --fetch-policy P       auto | always | never: fetch a chunk the cache tier holds when that is
                         measured to be faster than recomputing it (auto, default), always, or never
  --lease-wait-min-ms N  floor of the wait for another worker computing a chunk (its lease)
                         before computing it here as well (default 250; otherwise 3x the chunk's
                         measured compute time, at most 30 s)
  --publish-budget BYTES computed chunks waiting to be published, at most (default 1GiB); past it a
                         publication is dropped and counted, never waited for
  --chunk-mac-key-file F the fleet's secret (32+ bytes): chunks this worker publishes are signed
                         with it (HMAC-SHA256), and fetched chunks whose MAC does not match are
                         refused and recomputed (default: chunks are neither signed nor checked)
 Towards the cache servers (--cache-servers):
)";
}  // namespace

std::string ModelSetupUsage() { return absl::StrCat(kUsage, ClientSecurityUsage("cache-")); }

void AddModelSetupFlags(FlagParser& parser, ModelSetupFlags& flags) {
  ModelSetupOptions& s = flags.setup;
  parser.AddString("--model", &s.model);
  parser.AddString("--tokenizer", &s.tokenizer);
  parser.Add("--mode", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.engine.mode, ParseAttentionMode(v));
    return absl::OkStatus();
  });
  parser.Add("--device", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.device, ParseDevice(v));
    return absl::OkStatus();
  });
  parser.Add("--dtype", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.dtype, ParseModelDtype(v));
    return absl::OkStatus();
  });
  parser.Add("--shared-decode", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.shared_decode, ParseSharedDecode(v));
    return absl::OkStatus();
  });
  parser.AddInt("--block-size", &s.block_size);
  parser.AddByteSize("--kv-pool", &s.kv_pool_bytes);
  parser.AddInt("--max-prefill-tokens", &s.engine.max_prefill_tokens);
  parser.AddString("--cache-servers", &s.cache_tier.servers);
  AddClientSecurityFlags(parser, s.cache_tier.security, "cache-");
  parser.AddInt("--cache-min-deadline-ms", &s.cache_tier.min_call_deadline_ms);
  parser.AddInt("--cache-lookup-lease-ms", &s.cache_tier.lookup_lease_ms);
  parser.Add("--transport", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.cache_tier.transport, ParseFetchTransport(v));
    return absl::OkStatus();
  });
  parser.AddString("--cache-dir", &s.cache_tier.dir);
  parser.AddByteSize("--cache-host-capacity", &s.cache_tier.host_bytes);
  parser.AddByteSize("--cache-disk-capacity", &s.cache_tier.disk_bytes);
  parser.AddSwitch("--no-cache-tier", &flags.no_cache_tier);
  parser.Add("--fetch-policy", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.engine.pipeline.fetch_policy, ParseFetchPolicy(v));
    return absl::OkStatus();
  });
  parser.Add("--lease-wait-min-ms", [&s](const std::string& v) -> absl::Status {
    int ms = 0;
    if (!absl::SimpleAtoi(v, &ms) || ms < 0) {
      return absl::InvalidArgumentError("--lease-wait-min-ms must be a count of milliseconds, not '" + v + "'");
    }
    s.engine.pipeline.min_lease_wait = std::chrono::milliseconds(ms);
    return absl::OkStatus();
  });
  parser.AddByteSize("--publish-budget", &s.engine.pipeline.max_publish_bytes);
  parser.Add("--chunk-mac-key-file", [&s](const std::string& v) -> absl::Status {
    ASSIGN_OR_RETURN(s.engine.pipeline.mac, ChunkMac::FromKeyFile(v));
    return absl::OkStatus();
  });
}

absl::Status FinishModelSetupFlags(ModelSetupFlags& flags, const std::string& holder) {
  if (flags.setup.model.empty()) return absl::InvalidArgumentError("--model is required");
  flags.setup.cache_tier.enabled = !flags.no_cache_tier;
  flags.setup.cache_tier.holder = holder;
  return absl::OkStatus();
}

}  // namespace lazykv

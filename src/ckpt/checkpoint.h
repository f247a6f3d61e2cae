// Checkpoints on cistern (docs/checkpoint_format.md): a directory holding a
// safetensors data file and a JSON manifest committed last.
//
//   <root>/<name>/rank-00000.safetensors   the tensors this checkpoint wrote
//   <root>/<name>/manifest.json            every tensor: where its bytes are,
//                                          CRC32C, per-block XXH3-128 hashes
//
// save() writes and syncs the data file, then the manifest under a
// temporary name, renames it into place and syncs the namespace: before
// the rename nothing of the checkpoint is listed, after it all of it is,
// and a crash in between leaves a directory without a manifest that
// list() skips and the next save() of that name clears. With a base, a
// tensor whose bytes hash the same block by block as the base's tensor of
// that name is not written again: the manifest points at the file that
// holds it (in the base, or wherever the base found it), a sibling
// directory under the same root. remove() keeps newer checkpoints whole:
// files they still use are linked into the newest of them and their
// manifests rewritten before the old directory goes.
//
// This is the synchronous engine over libcistern's public API; the Python
// module's asynchronous save stages tensors in host memory and calls it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cistern/client.h"
#include "ckpt/manifest.h"
#include "common/result.h"

namespace cistern::ckpt {

struct TensorData {
  std::string name;
  DType dtype = DType::kU8;
  std::vector<uint64_t> shape;     // empty: 0-d
  std::span<const uint8_t> bytes;  // exactly elements x dtype size, C order
};

inline constexpr std::string_view kManifestName = "manifest.json";
// "rank-00003.safetensors": the data file rank 3 writes.
std::string dataFileName(uint32_t rank);
// "manifest.rank-00003.json": what rank 3 wrote, until commit() merges it.
std::string rankManifestName(uint32_t rank);

struct SaveOptions {
  // A committed checkpoint in the same root whose unchanged tensors are
  // reused instead of written ("" none).
  std::string base;
  // Hash block size (the unit of change detection). Default: 4 MiB.
  uint64_t block_bytes = 4ull << 20;
  // Tensors written at once (each one's chunks also go out in parallel).
  // Default: 4.
  uint32_t write_threads = 4;
  // "zstd" or "lz4": each written tensor compressed on its own, into
  // rank-NNNNN.<codec> (frames back to back, not a safetensors file); the
  // manifest holds each frame's place. Default: "" (none).
  std::string codec;
  std::map<std::string, std::string> metadata;
  // Several ranks save one checkpoint: each writes its own data file and
  // rank manifest (tensor names unique across ranks); commit() by one of
  // them, once every rank's save returned, makes it a checkpoint.
  // Default: rank 0 of 1 (save commits by itself).
  uint32_t rank = 0;
  uint32_t world_size = 1;
};

struct SaveStats {
  uint64_t tensors = 0;
  uint64_t tensors_reused = 0;
  uint64_t bytes_written = 0;  // tensor bytes written (headers and manifest not counted)
  uint64_t bytes_reused = 0;
  std::vector<std::string> reused;  // the names of the tensors reused
};

// Writes checkpoint `path` (see the header comment). Errors:
// kAlreadyExists when `path` holds a committed checkpoint, kInvalidArgument
// for a tensor whose bytes do not match its dtype and shape or a name given
// twice, kNotFound for a missing base; I/O errors as the client gives them.
Status save(Client& client, const std::string& path, std::span<const TensorData> tensors,
            const SaveOptions& options = {}, SaveStats* stats = nullptr);

// Merges the rank manifests of a checkpoint saved by `world_size` ranks into
// its manifest, committed as save() commits one. kNotFound naming a rank
// that has not saved; kInvalidArgument for a tensor name two ranks used.
Status commit(Client& client, const std::string& path, uint32_t world_size);

// kNotFound when `path` holds no committed checkpoint.
Result<Manifest> readManifest(Client& client, const std::string& path);
// Reads one tensor of the checkpoint at `path` into `out` (exactly its
// bytes), CRC-checked: kCorruption naming the tensor and the file.
Status readTensor(Client& client, const std::string& path, const ManifestTensor& t,
                  std::span<uint8_t> out);
// readTensor for many tensors of one checkpoint: each data file is opened
// once and kept open while the reader lives.
class TensorReader {
 public:
  TensorReader(Client& client, std::string path) : client_(client), path_(std::move(path)) {}
  Status read(const ManifestTensor& t, std::span<uint8_t> out);

 private:
  Client& client_;
  const std::string path_;
  std::map<std::string, std::unique_ptr<File>> files_;  // by path
};
// Reads every tensor and checks it; the first problem named.
Status verify(Client& client, const std::string& path);
// The names of the committed checkpoints under `root`, oldest first.
Result<std::vector<std::string>> list(Client& client, const std::string& root);
// Removes the checkpoint at `path`, keeping every newer one whole.
Status remove(Client& client, const std::string& path);

}  // namespace cistern::ckpt

// safetensors reading (single file or sharded with model.safetensors.index.json) and writing.
// Files are memory-mapped; tensors are views into the mapping. Every header is validated: JSON,
// dtype names, offsets inside the data section, no overlaps, byte size = shape × dtype size.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtypes.h"
#include "core/mapped_file.h"

namespace dsv4 {

struct TensorRef {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // file name (no directory), for error messages
  bool in_backend = false;  // `data` is backend memory (a weight generated in place): never read on the host

  int64_t numel() const {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  template <typename T> const T* as() const { return reinterpret_cast<const T*>(data); }
};

std::string shape_str(const std::vector<int64_t>& shape);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws Error naming the file
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, TensorRef> tensors_;
};

// A checkpoint directory: model.safetensors, or model.safetensors.index.json + shards.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);
  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorRef* find(const std::string& name) const;
  const TensorRef& get(const std::string& name) const;  // throws when missing
  const std::map<std::string, TensorRef>& tensors() const { return tensors_; }
  size_t total_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorRef> tensors_;
};

// One tensor to write: the bytes must match shape × dtype.
struct TensorOut {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
TensorOut make_tensor_out(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same from views (bytes owned elsewhere): nothing is copied before the write.
void write_safetensors(const std::string& path, const std::vector<const TensorRef*>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace dsv4

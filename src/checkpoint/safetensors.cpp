#include "checkpoint/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsv4 {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const std::string fname = fs::path(path).filename().string();
  const size_t size = file_.size();
  if (size < 8) fail("{}: truncated file ({} bytes, a safetensors file starts with an 8-byte header length)", fname, size);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file_.data(), 8);
  if (header_len > size - 8)
    fail("{}: header length {} runs past the end of the file ({} bytes)", fname, header_len, size);
  json header;
  try {
    header = json::parse(file_.data() + 8, file_.data() + 8 + header_len);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON header: {}", fname, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", fname);
  const uint8_t* data_start = file_.data() + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    auto bad = [&](const std::string& why) { fail("{}: tensor {}: {}", fname, name, why); };
    if (!info.is_object() || !info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets"))
      bad("entry needs dtype, shape and data_offsets");
    if (!info["dtype"].is_string()) bad("dtype is not a string");
    TensorRef t;
    t.name = name;
    t.file = fname;
    if (!dtype_from_name(info["dtype"].get<std::string>(), &t.dtype))
      bad(fmt::format("unknown dtype {}", info["dtype"].dump()));
    if (!info["shape"].is_array()) bad("shape is not an array");
    for (auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("shape holds a non-integer or negative dimension");
      t.shape.push_back(d.get<int64_t>());
    }
    auto& off = info["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets must be two non-negative integers");
    size_t begin = off[0].get<size_t>(), end = off[1].get<size_t>();
    if (begin > end || end > data_size)
      bad(fmt::format("data_offsets [{},{}] out of range (data section is {} bytes)", begin, end, data_size));
    size_t expect = size_t(t.numel()) * dtype_size(t.dtype);
    if (end - begin != expect)
      bad(fmt::format("holds {} bytes, shape {} of {} needs {}", end - begin, shape_str(t.shape),
                      dtype_name(t.dtype), expect));
    t.data = data_start + begin;
    t.nbytes = end - begin;
    ranges.emplace_back(begin, end);
    tensors_.emplace(name, std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second)
      fail("{}: tensors overlap in the data section (bytes {}..{} and {}..{})", fname, ranges[i - 1].first,
           ranges[i - 1].second, ranges[i].first, ranges[i].second);
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail("{}: not a directory", dir);
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  json weight_map;
  if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("{}: invalid JSON: {}", index.string(), e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: no weight_map object", index.string());
    weight_map = j["weight_map"];
    for (auto& [name, file] : weight_map.items()) {
      if (!file.is_string()) fail("{}: weight_map entry {} is not a file name", index.string(), name);
      auto f = file.get<std::string>();
      if (std::find(shard_names.begin(), shard_names.end(), f) == shard_names.end()) shard_names.push_back(f);
    }
    std::sort(shard_names.begin(), shard_names.end());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shard_names.push_back("model.safetensors");
  } else {
    for (auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty()) fail("{}: no model.safetensors.index.json and no .safetensors files", dir);
  }
  for (auto& name : shard_names) {
    fs::path p = fs::path(dir) / name;
    if (!fs::exists(p)) fail("{}: shard {} named by the index is missing", dir, name);
    files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
    for (auto& [tname, t] : files_.back()->tensors()) {
      if (tensors_.count(tname)) fail("tensor {} appears in both {} and {}", tname, tensors_[tname].file, name);
      if (!weight_map.is_null()) {
        if (!weight_map.contains(tname))
          fail("{}: tensor {} is not listed in model.safetensors.index.json", name, tname);
        if (weight_map[tname].get<std::string>() != name)
          fail("{}: tensor {} is listed in the index under {}", name, tname, weight_map[tname].get<std::string>());
      }
      tensors_.emplace(tname, t);
    }
  }
  if (!weight_map.is_null())
    for (auto& [tname, file] : weight_map.items())
      if (!tensors_.count(tname))
        fail("{}: tensor {} listed in model.safetensors.index.json is missing", file.get<std::string>(), tname);
}

const TensorRef* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorRef& Checkpoint::get(const std::string& name) const {
  auto* t = find(name);
  if (!t) fail("{}: tensor {} is missing", dir_, name);
  return *t;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& [_, t] : tensors_) n += t.nbytes;
  return n;
}

TensorOut make_tensor_out(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
  TensorOut t{std::move(name), dtype, std::move(shape), {}};
  size_t n = dtype_size(dtype);
  for (auto d : t.shape) n *= size_t(d);
  t.bytes.resize(n);
  if (n) std::memcpy(t.bytes.data(), data, n);
  return t;
}

namespace {

// One tensor as written: a view of its bytes.
struct TensorBytes {
  const std::string& name;
  DType dtype;
  const std::vector<int64_t>& shape;
  const uint8_t* data;
  size_t size;
};

void write_tensors(const std::string& path, const std::vector<TensorBytes>& tensors,
                   const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (auto& t : tensors) {
    size_t expect = dtype_size(t.dtype);
    for (auto d : t.shape) expect *= size_t(d);
    if (expect != t.size) fail("write {}: tensor {} has {} bytes, shape needs {}", path, t.name, t.size, expect);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.size}}};
    offset += t.size;
  }
  std::string h = header.dump();
  while ((h.size() + 8) % 8) h.push_back(' ');  // keep the data section 8-byte aligned
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path);
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), std::streamsize(h.size()));
  for (auto& t : tensors) out.write(reinterpret_cast<const char*>(t.data), std::streamsize(t.size));
  if (!out) fail("{}: write failed", path);
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<TensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorBytes> v;
  for (auto& t : tensors) v.push_back({t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size()});
  write_tensors(path, v, metadata);
}

void write_safetensors(const std::string& path, const std::vector<const TensorRef*>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorBytes> v;
  for (const TensorRef* t : tensors) v.push_back({t->name, t->dtype, t->shape, t->data, t->nbytes});
  write_tensors(path, v, metadata);
}

}  // namespace dsv4

// The sm_120 resource test (issue 14): every kernel of the CUDA library's sm_120a code that the
// dispatchers can launch on an RTX PRO 6000 must fit that GPU: static + dynamic shared memory within
// the 99 KB per block, registers × threads within the register file, no local memory. No GPU needed:
//   - the static numbers (REG, SHARED, LOCAL, STACK, launch bounds) come from the sm_120a ELF images
//     in the library's fat binaries, read here (the cubin's .nv.info attributes and .nv.shared /
//     .nv.local sections: what `cuobjdump --dump-resource-usage` prints, which is checked against
//     this reader wherever cuobjdump is installed);
//   - the dynamic shared memory and block sizes come from the dispatchers' own choice functions
//     (sparse_mla_kernel_launches, moe_fp4_kernel_launches) evaluated for kSm120Limits, and the
//     load-time repack's launches (moe_fp4_repack_kernel_launches).
// A kernel no launch list names is checked with its __launch_bounds__ block, or 1024 threads.
#include <cxxabi.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_limits.h"
#include "backend/cuda/moe_fp4.h"
#include "backend/cuda/moe_fp4_repack.h"
#include "backend/cuda/sparse_mla_decode.h"

namespace dsv4::cuda {
namespace {

struct FunctionResources {
  std::string mangled;
  int regs = 0;
  size_t shared = 0;  // .nv.shared.<f>: static shared memory + the driver's reservation (cuobjdump's SHARED)
  size_t local = 0;   // .nv.local.<f>
  size_t stack = 0;   // EIATTR_FRAME_SIZE
  int max_threads = 0;  // EIATTR_MAX_THREADS (__launch_bounds__), 0 = none
};

template <typename T>
T read_at(const std::string& d, size_t off) {
  T v{};
  if (off + sizeof(T) > d.size()) throw std::runtime_error("truncated image");
  std::memcpy(&v, d.data() + off, sizeof(T));
  return v;
}

struct Section {
  std::string name;
  uint32_t type = 0, link = 0, info = 0;
  uint64_t offset = 0, size = 0;
};

// The section table of a 64-bit little-endian ELF image (host object or cubin).
std::vector<Section> elf_sections(const std::string& e) {
  if (e.size() < 64 || e.compare(0, 4, "\x7f" "ELF") != 0) return {};
  const uint64_t shoff = read_at<uint64_t>(e, 0x28);
  const uint16_t shentsize = read_at<uint16_t>(e, 0x3a), shnum = read_at<uint16_t>(e, 0x3c),
                 shstrndx = read_at<uint16_t>(e, 0x3e);
  std::vector<Section> out(shnum);
  std::vector<uint32_t> name_off(shnum);
  for (int i = 0; i < shnum; ++i) {
    const size_t h = shoff + size_t(i) * shentsize;
    name_off[i] = read_at<uint32_t>(e, h);
    out[i].type = read_at<uint32_t>(e, h + 4);
    out[i].offset = read_at<uint64_t>(e, h + 0x18);
    out[i].size = read_at<uint64_t>(e, h + 0x20);
    out[i].link = read_at<uint32_t>(e, h + 0x28);
    out[i].info = read_at<uint32_t>(e, h + 0x2c);
  }
  for (int i = 0; i < shnum; ++i) out[i].name = e.c_str() + out[shstrndx].offset + name_off[i];
  return out;
}

// The ELF images for sm_<arch> in one fat binary (kind 2 = ELF; ELF images are stored uncompressed,
// only PTX is compressed by default, and a compressed ELF would fail the magic check below).
std::vector<std::string> fatbin_elfs(const std::string& fb, uint32_t arch) {
  std::vector<std::string> out;
  for (size_t off = 0; off + 16 <= fb.size();) {
    if (read_at<uint32_t>(fb, off) != 0xBA55ED50u) break;
    const uint16_t header = read_at<uint16_t>(fb, off + 6);
    const uint64_t size = read_at<uint64_t>(fb, off + 8);
    for (size_t p = off + header; p < off + header + size;) {
      const uint16_t kind = read_at<uint16_t>(fb, p);
      const uint32_t entry_header = read_at<uint32_t>(fb, p + 4);
      const uint64_t payload = read_at<uint64_t>(fb, p + 8);
      if (kind == 2 && read_at<uint32_t>(fb, p + 0x1c) == arch) {
        std::string image = fb.substr(p + entry_header, payload);
        if (image.compare(0, 4, "\x7f" "ELF") != 0) throw std::runtime_error("compressed ELF image in the fat binary");
        out.push_back(std::move(image));
      }
      p += entry_header + payload;
    }
    off += header + size;
  }
  return out;
}

// Per-function resources of one cubin.
void cubin_functions(const std::string& e, std::map<std::string, FunctionResources>& out) {
  const std::vector<Section> secs = elf_sections(e);
  std::vector<std::string> symbols;
  for (const Section& s : secs) {
    if (s.type != 2) continue;  // SHT_SYMTAB
    for (uint64_t k = 0; k < s.size / 24; ++k)
      symbols.push_back(e.c_str() + secs[s.link].offset + read_at<uint32_t>(e, s.offset + k * 24));
  }
  auto fn = [&](const std::string& name) -> FunctionResources& {
    FunctionResources& f = out[name];
    f.mangled = name;
    return f;
  };
  for (const Section& s : secs)
    if (s.name.rfind(".text.", 0) == 0) fn(s.name.substr(6));
  for (const Section& s : secs) {
    if (s.name.rfind(".nv.shared.", 0) == 0 && out.count(s.name.substr(11))) fn(s.name.substr(11)).shared = s.size;
    if (s.name.rfind(".nv.local.", 0) == 0 && out.count(s.name.substr(10))) fn(s.name.substr(10)).local = s.size;
    if (s.name.rfind(".nv.info", 0) != 0) continue;
    const std::string owner = s.name.size() > 9 ? s.name.substr(9) : "";
    for (uint64_t p = s.offset; p + 4 <= s.offset + s.size;) {
      const uint8_t format = uint8_t(e[p]), attr = uint8_t(e[p + 1]);
      const uint16_t value = read_at<uint16_t>(e, p + 2);
      p += 4;
      if (format != 0x04) continue;  // EIFMT_SVAL: `value` bytes follow
      if (owner.empty() && (attr == 0x2f || attr == 0x11) && value >= 8) {  // EIATTR_REGCOUNT, EIATTR_FRAME_SIZE
        const uint32_t sym = read_at<uint32_t>(e, p), v = read_at<uint32_t>(e, p + 4);
        if (sym < symbols.size() && out.count(symbols[sym])) {
          if (attr == 0x2f) fn(symbols[sym]).regs = int(v);
          else fn(symbols[sym]).stack = v;
        }
      }
      if (!owner.empty() && attr == 0x05 && value >= 12 && out.count(owner))  // EIATTR_MAX_THREADS
        fn(owner).max_threads = int(read_at<uint32_t>(e, p) * read_at<uint32_t>(e, p + 4) * read_at<uint32_t>(e, p + 8));
      p += value;
    }
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The sm_120 functions of every object in a static library (GNU ar), from each member's .nv_fatbin.
std::map<std::string, FunctionResources> library_functions(const std::string& lib, uint32_t arch) {
  const std::string a = read_file(lib);
  if (a.compare(0, 8, "!<arch>\n") != 0) throw std::runtime_error(lib + " is not an ar archive");
  std::map<std::string, FunctionResources> out;
  for (size_t off = 8; off + 60 <= a.size();) {
    const size_t size = std::stoull(a.substr(off + 48, 10));
    const std::string member = a.substr(off + 60, size);
    for (const Section& s : elf_sections(member))
      if (s.name == ".nv_fatbin")
        for (const std::string& cubin : fatbin_elfs(member.substr(s.offset, s.size), arch)) cubin_functions(cubin, out);
    off += 60 + size + (size & 1);
  }
  return out;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
  return status == 0 && d ? std::string(d.get()) : mangled;
}

// "void ns::(anonymous namespace)::name<args>(params)" → "name<args>": the part a KernelLaunch names.
std::string short_name(std::string demangled) {
  for (size_t a; (a = demangled.find("(anonymous namespace)")) != std::string::npos;)
    demangled.replace(a, 21, "anonymous");
  int depth = 0;
  size_t end = demangled.size(), start = 0;
  for (size_t i = 0; i < demangled.size(); ++i) {
    const char c = demangled[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (depth != 0) continue;
    if (c == '(') { end = i; break; }
    if (c == ' ') start = i + 1;  // after the return type
    if (c == ':' && i + 1 < demangled.size() && demangled[i + 1] == ':') start = i + 2;
  }
  return demangled.substr(start, end - start);
}

std::vector<KernelLaunch> sm120_launches() {
  std::vector<KernelLaunch> all = sparse_mla_kernel_launches(kSm120Limits);
  // DeepSeek-V4-Flash (hidden 4096, 2048 per expert, 256 experts) and the fixtures' small shapes, both formats.
  for (MoeFp4Format f : {MoeFp4Format::Mxfp4, MoeFp4Format::Nvfp4})
    for (std::array<int, 3> dims : {std::array<int, 3>{4096, 2048, 256}, std::array<int, 3>{128, 128, 8}}) {
      MoeFp4Shape shape;
      shape.format = f;
      shape.hidden = dims[0];
      shape.inter = dims[1];
      shape.experts = dims[2];
      for (const KernelLaunch& k : moe_fp4_kernel_launches(shape, kSm120Limits)) all.push_back(k);
    }
  for (const KernelLaunch& k : moe_fp4_repack_kernel_launches()) all.push_back(k);  // at load, any shape
  return all;
}

// cuobjdump's REG / SHARED / LOCAL per function of the sm_120a images, where the tool is installed.
std::map<std::string, std::array<long, 3>> cuobjdump_resources(const std::string& tool, const std::string& lib) {
  std::map<std::string, std::array<long, 3>> out;
  const std::string cmd = "'" + tool + "' --dump-resource-usage '" + lib + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) return out;
  std::string text;
  std::array<char, 4096> buf;
  while (fgets(buf.data(), buf.size(), pipe.get())) text += buf.data();
  bool sm120 = false;
  std::string function;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string line = text.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    if (line.rfind("arch = ", 0) == 0) sm120 = line.find("sm_120") != std::string::npos;
    if (line.rfind("Fatbin ptx code", 0) == 0) sm120 = false;
    const size_t f = line.find("Function ");
    if (f != std::string::npos && line.back() == ':') function = line.substr(f + 9, line.size() - f - 10);
    auto field = [&](const char* key) {
      const size_t k = line.find(key);
      return k == std::string::npos ? -1L : std::strtol(line.c_str() + k + std::strlen(key), nullptr, 10);
    };
    if (sm120 && !function.empty() && line.find("REG:") != std::string::npos) {
      out[function] = {field("REG:"), field("SHARED:"), field("LOCAL:")};
      function.clear();
    }
  }
  return out;
}

TEST(Sm120Resources, EveryKernelTheDispatchCanChooseFits) {
  const DeviceLimits lim = kSm120Limits;
  const std::map<std::string, FunctionResources> functions = library_functions(DSV4_CUDA_LIBRARY, 120);
  ASSERT_FALSE(functions.empty()) << DSV4_CUDA_LIBRARY << " holds no sm_120 code (DSV4_CUDA_ARCHS must list 120a)";
  const std::vector<KernelLaunch> launches = sm120_launches();

  std::map<std::string, bool> launch_found;
  for (const KernelLaunch& k : launches) launch_found[k.kernel] = false;
  int failures = 0, kernels = 0;
  std::printf("sm_120 limits: %zu B shared memory per block (opt-in), %zu B reserved per block, %d registers per SM\n",
              lim.smem_per_block_optin, lim.reserved_smem_per_block, lim.regs_per_sm);
  std::printf("%-58s %7s %4s %6s %7s %7s %7s %5s  %s\n", "kernel (sm_120a)", "threads", "REG", "STACK", "static",
              "dynamic", "total", "LOCAL", "verdict");
  for (const auto& [mangled, f] : functions) {
    if (mangled.rfind("$", 0) == 0) continue;  // device-side helper routines (no kernels)
    ++kernels;
    const std::string name = short_name(demangle(mangled));
    int threads = 0;
    size_t dynamic = 0;
    bool listed = false;
    for (const KernelLaunch& k : launches)
      if (k.kernel == name) {
        listed = true;
        launch_found[k.kernel] = true;
        threads = std::max(threads, k.threads);
        dynamic = std::max(dynamic, k.dynamic_smem);
      }
    if (!listed) threads = f.max_threads ? f.max_threads : 1024;
    const size_t static_smem = f.shared > lim.reserved_smem_per_block ? f.shared - lim.reserved_smem_per_block : 0;
    const size_t total = static_smem + dynamic;
    // Registers are allocated per warp in units of 256 (8 per thread).
    const long regs_block = long((f.regs + 7) / 8 * 8) * 32 * ((threads + 31) / 32);
    std::string verdict;
    if (total > lim.smem_per_block_optin) verdict += "SHARED MEMORY > 99 KB; ";
    if (regs_block > lim.regs_per_sm) verdict += "REGISTERS × THREADS > REGISTER FILE; ";
    if (f.local > 0) verdict += "LOCAL MEMORY; ";
    if (!verdict.empty()) ++failures;
    const std::string shown = name.size() > 58 ? name.substr(0, 55) + "..." : name;
    std::printf("%-58s %6d%s %4d %6zu %7zu %7zu %7zu %5zu  %s\n", shown.c_str(), threads,
                listed ? " " : (f.max_threads ? "b" : "?"), f.regs, f.stack, static_smem, dynamic, total, f.local,
                verdict.empty() ? "ok" : verdict.c_str());
    EXPECT_TRUE(verdict.empty()) << name << ": " << verdict;
  }
  std::printf("threads: from the dispatch's launch list; b = its __launch_bounds__; ? = none known, 1024 assumed\n");
  std::printf("%d sm_120a kernels checked, %zu dispatch launches, %d over a limit\n", kernels, launch_found.size(),
              failures);
  for (const auto& [kernel, found] : launch_found)
    EXPECT_TRUE(found) << "the dispatch may launch " << kernel << ", which the sm_120a code does not hold";
}

// The ELF reader above agrees with cuobjdump (where installed; the build machine may lack it).
TEST(Sm120Resources, ReaderMatchesCuobjdump) {
  const std::string tool = DSV4_CUOBJDUMP;
  if (!std::filesystem::exists(tool)) GTEST_SKIP() << tool << " not installed: the reader is not cross-checked here";
  const auto dumped = cuobjdump_resources(tool, DSV4_CUDA_LIBRARY);
  const auto functions = library_functions(DSV4_CUDA_LIBRARY, 120);
  ASSERT_FALSE(dumped.empty());
  int compared = 0;
  for (const auto& [mangled, f] : functions) {
    if (mangled.rfind("$", 0) == 0) continue;
    const auto it = dumped.find(mangled);
    ASSERT_NE(it, dumped.end()) << "cuobjdump lists no sm_120 function " << mangled;
    EXPECT_EQ(it->second[0], f.regs) << mangled;
    EXPECT_EQ(it->second[1], long(f.shared)) << mangled;
    EXPECT_EQ(it->second[2], long(f.local)) << mangled;
    ++compared;
  }
  std::printf("%d sm_120a functions: REG, SHARED and LOCAL equal to cuobjdump's\n", compared);
}

}  // namespace
}  // namespace dsv4::cuda

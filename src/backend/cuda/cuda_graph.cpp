#include "backend/cuda/cuda_graph.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace dsv4::cuda {

std::string kernel_display_name(const char* mangled) {
  if (!mangled || !*mangled) return "kernel";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> plain(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && plain ? plain.get() : mangled;
  int depth = 0;
  size_t cut = name.size(), scope = 0;
  for (size_t i = 0; i < name.size() && cut == name.size(); ++i) {
    const char ch = name[i];
    if (ch == '<') ++depth;
    else if (ch == '>') --depth;
    else if (ch == '(' && depth == 0 && name.compare(i, 21, "(anonymous namespace)") != 0) cut = i;
    else if (ch == ':' && depth == 0 && i + 1 < name.size() && name[i + 1] == ':') scope = i + 2;
  }
  return name.substr(scope, cut - scope);
}

namespace {

const char* node_kind(cudaGraphNodeType type) {
  switch (type) {
    case cudaGraphNodeTypeMemcpy: return "copy";
    case cudaGraphNodeTypeMemset: return "set";
    case cudaGraphNodeTypeHost: return "host function";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEmpty: return "empty";
    default: return "other";
  }
}

std::string node_name(cudaGraphNode_t node) {
  cudaGraphNodeType type{};
  if (cudaGraphNodeGetType(node, &type) != cudaSuccess) return "other";
  if (type != cudaGraphNodeTypeKernel) return node_kind(type);
  cudaKernelNodeParams p{};
  const char* mangled = nullptr;
  if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || cudaFuncGetName(&mangled, p.func) != cudaSuccess)
    return "kernel";
  return kernel_display_name(mangled);
}

// The graph's nodes in the order they were made (cudaGraphGetNodes lists them so).
std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph) {
  size_t n = 0;
  if (!graph || cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) return {};
  std::vector<cudaGraphNode_t> nodes(n);
  if (n && cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) return {};
  return nodes;
}

}  // namespace

int64_t CudaGraph::items() const {
  size_t n = 0;
  return graph && cudaGraphGetNodes(graph, nullptr, &n) == cudaSuccess ? int64_t(n) : 0;
}

std::vector<std::string> CudaGraph::item_names() const {
  std::vector<std::string> names;
  for (cudaGraphNode_t node : nodes_of(graph)) names.push_back(node_name(node));
  (void)cudaGetLastError();  // a node the queries could not read is named "kernel" or "other"
  return names;
}

std::vector<CapturedWork::ItemKind> CudaGraph::item_kinds() const {
  const std::vector<cudaGraphNode_t> nodes = nodes_of(graph);
  size_t edges = 0;
  if (nodes.empty() || cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges) != cudaSuccess) return {};
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  if (edges && cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges) != cudaSuccess) return {};
  std::vector<cudaGraphNode_t> early;
  for (size_t e = 0; e < edges; ++e)
    if (data[e].type == cudaGraphDependencyTypeProgrammatic) early.push_back(to[e]);
  std::sort(early.begin(), early.end());
  std::vector<ItemKind> kinds;
  for (cudaGraphNode_t node : nodes) {
    const std::string name = node_name(node);
    auto it = std::find_if(kinds.begin(), kinds.end(), [&](const ItemKind& k) { return k.name == name; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), ItemKind{name});
    ++it->count;
    it->early += std::binary_search(early.begin(), early.end(), node);
  }
  (void)cudaGetLastError();
  std::stable_sort(kinds.begin(), kinds.end(), [](const ItemKind& a, const ItemKind& b) { return a.count > b.count; });
  return kinds;
}

CudaGraph::~CudaGraph() {
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
}

int64_t captured_items(cudaStream_t stream) {
  cudaStreamCaptureStatus status{};
  cudaGraph_t graph = nullptr;
  if (cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph) != cudaSuccess || status != cudaStreamCaptureStatusActive ||
      !graph) {
    (void)cudaGetLastError();
    return 0;
  }
  size_t n = 0;
  return cudaGraphGetNodes(graph, nullptr, &n) == cudaSuccess ? int64_t(n) : 0;
}

}  // namespace dsv4::cuda

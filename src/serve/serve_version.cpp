// The version string the server and CLI report.
namespace dsv4 {
const char* version_string() { return "dsv4 0.1.0"; }
}  // namespace dsv4

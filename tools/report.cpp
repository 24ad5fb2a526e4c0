// quantforge report PATH... -o OUT [--force]
// Perplexity- and KL-versus-size chart of several quantized outputs of one
// model. The inputs are read and validated here (eval/report_input.h) and the
// output folder is checked before anything starts, so a bad input or output
// is one line with its exit code; the Python side reads them with the same
// C++ parser and only draws. The drawing is matplotlib's (Debian's
// python3-matplotlib), through the Python package's quantforge.chart
// (qf.report()), which this command runs with Debian's /usr/bin/python3: a
// well-kept plotting library instead of a hand-made PNG writer, and the same
// code as qf.report() in notebooks.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"
#include "core/error.h"
#include "eval/report_input.h"

namespace qf::cli {
namespace {

namespace fs = std::filesystem;

// build/python beside build/bin (the build tree), or $QF_PYTHONPATH.
fs::path python_package_dir() {
  if (const char* p = std::getenv("QF_PYTHONPATH"); p && *p) return p;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return exe.parent_path().parent_path() / "python";
}

void run_report(const std::vector<std::string>& paths, const std::string& out, bool force) {
  const eval::ReportInputs inputs = eval::load_report_inputs(paths);
  eval::check_report_output(out, inputs.read, force, "-o");
  const fs::path pkg = python_package_dir();
  if (pkg.empty() || !fs::exists(pkg / "quantforge" / "chart.py"))
    throw unsupported("report", "the Python package is not at " + (pkg / "quantforge").string() +
                                    " (build with QF_PYTHON=ON, or set QF_PYTHONPATH to its parent folder)");
  // "--output=OUT" and "--" before the paths: a name that starts with '-' stays a name.
  std::vector<std::string> args = {"/usr/bin/python3", "-m", "quantforge.chart", "--output=" + out};
  if (force) args.push_back("--force");
  args.push_back("--");
  args.insert(args.end(), paths.begin(), paths.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) throw io_error("report", "cannot start /usr/bin/python3");
  if (pid == 0) {
    const char* old = std::getenv("PYTHONPATH");
    const std::string pp = pkg.string() + (old && *old ? ":" + std::string(old) : "");
    setenv("PYTHONPATH", pp.c_str(), 1);
    setenv("MPLBACKEND", "Agg", 1);
    execv(argv[0], argv.data());
    std::fprintf(stderr, "quantforge: unsupported: report: cannot run /usr/bin/python3\n");
    _exit(4);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (code != 0) {
    std::fflush(stdout);
    std::_Exit(code);  // the report printed its one-line error itself
  }
}

}  // namespace

void register_report(CLI::App& app) {
  auto paths = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "report", "Perplexity- and KL-versus-size chart (PNG + HTML) of quantize outputs and eval JSONs of one model");
  cmd->add_option("paths", *paths, "quantize output folders (evaluated with --eval) and eval --json files")->required();
  cmd->add_option("-o,--output", *out, "folder for chart.png, index.html and report.json")->required();
  cmd->add_flag("--force", *force, "replace chart.png, index.html and report.json in an existing output folder");
  cmd->callback([paths, out, force] { run_report(*paths, *out, *force); });
}

}  // namespace qf::cli

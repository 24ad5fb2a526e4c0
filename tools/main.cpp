// quantforge: the command-line entry point. Parses, dispatches, and turns every
// error into one line on stderr and a documented exit code (see README.md).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <new>

#include "commands.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/progress.h"
#include "core/simd.h"

namespace {

// Results printed on stdout must reach it: a full disk or /dev/full is an i/o
// error (exit 5), never a silent success.
int finish_stdout() {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  const int e = flush_failed ? errno : 0;
  if (flush_failed || std::ferror(stdout)) {
    std::fprintf(stderr, "quantforge: %s: standard output: write failed%s%s\n", qf::kind_name(qf::ErrorKind::Io),
                 e ? ": " : " (the stream reported an error: disk full or closed?)", e ? std::strerror(e) : "");
    return qf::exit_code(qf::ErrorKind::Io);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First, before any thread exists: SIGINT/SIGTERM/SIGHUP remove temporaries.
  qf::install_interrupt_cleanup();
  CLI::App app{"quantforge: offline LLM quantization and model conversion"};
  // Options of the top level (-q) are accepted after the subcommand too;
  // subcommands inherit this when they are created below.
  app.fallthrough();
  app.set_version_flag("--version", std::string("quantforge ") + QF_VERSION);
  app.require_subcommand(1);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress output on stderr")->configurable(false);
  app.parse_complete_callback([&] {
    qf::Progress::set_quiet(quiet);
    qf::simd_level();  // a bad QF_SIMD ends every command here (usage error)
  });
  qf::cli::register_inspect(app);
  qf::cli::register_tokenize(app);
  qf::cli::register_convert(app);
  qf::cli::register_merge(app);
  qf::cli::register_generate(app);
  qf::cli::register_eval(app);
  qf::cli::register_bench(app);
  qf::cli::register_imatrix(app);
  qf::cli::register_quantize(app);
  qf::cli::register_report(app);
  qf::cli::register_batch(app);
  qf::cli::register_kv_sweep(app);
  try {
    try {
      app.parse(argc, argv);
      return finish_stdout();
    } catch (...) {
      // Work that failed because of an interrupt does not choose the exit
      // status: the clean-up thread ends the process by the signal.
      if (qf::interrupted()) qf::await_interrupt_exit();
      throw;
    }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "quantforge: usage error: %s (see --help)\n", e.what());
    return qf::exit_code(qf::ErrorKind::Usage);
  } catch (const qf::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "quantforge: %s: %s\n", qf::kind_name(e.kind()), e.what());
    return qf::exit_code(e.kind());
  } catch (const std::filesystem::filesystem_error& e) {
    // A filesystem call outside the library's own checks: still an i/o error
    // about a named path, not a crash.
    std::fflush(stdout);
    std::fprintf(stderr, "quantforge: %s: %s: %s\n", qf::kind_name(qf::ErrorKind::Io), e.path1().c_str(),
                 e.code().message().c_str());
    return qf::exit_code(qf::ErrorKind::Io);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "quantforge: out of memory\n");
    return qf::exit_code(qf::ErrorKind::Io);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "quantforge: internal error: %s\n", e.what());
    return qf::exit_code(qf::ErrorKind::Internal);
  }
}

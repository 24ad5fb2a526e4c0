// quantforge: the command-line entry point. Parses, dispatches, and turns every
// error into one line on stderr and a documented exit code (see README.md).
#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>

#include "commands.h"
#include "core/error.h"
#include "core/progress.h"

int main(int argc, char** argv) {
  CLI::App app{"quantforge: offline LLM quantization and model conversion"};
  app.set_version_flag("--version", std::string("quantforge ") + QF_VERSION);
  app.require_subcommand(1);
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress output on stderr")->configurable(false);
  app.parse_complete_callback([&] { qf::Progress::set_quiet(quiet); });
  qf::cli::register_inspect(app);
  qf::cli::register_tokenize(app);
  qf::cli::register_convert(app);
  qf::cli::register_generate(app);
  qf::cli::register_eval(app);
  qf::cli::register_bench(app);
  qf::cli::register_imatrix(app);
  qf::cli::register_quantize(app);
  try {
    app.parse(argc, argv);
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
    std::fprintf(stderr, "quantforge: %s: %s\n", qf::kind_name(e.kind()), e.what());
    return qf::exit_code(e.kind());
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the code did not expect to fail on (a name too long, a folder
    // without permission): one line naming it, not the library's text.
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
  return 0;
}

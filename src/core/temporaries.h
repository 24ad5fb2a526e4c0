// Temporary files and folders that stand in for an output while it is being
// written, and their clean-up.
//
// Every temporary is a hidden sibling of the output it belongs to, named
//   .NAME.KIND.HOST.PID.RAND        (KIND: "tmp" for the output itself,
//                                          "spill" for spilled activations)
// so that a person can tell what it is, and a later run to the same output can
// tell whether its owner is gone: a temporary whose HOST is this machine and
// whose PID no longer runs was left by a killed process (kill -9, power loss)
// and is removed by remove_stale_temporaries(). Temporaries of live processes
// and of other hosts (a shared filesystem) are never touched.
//
// Live temporaries are registered so that an interrupt (see interrupt.h)
// removes them before the process ends.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace qf {

// This machine's host name reduced to [A-Za-z0-9-] (at most 32 characters;
// "host" when it has none).
const std::string& temp_host_tag();

// A fresh name ".NAME.KIND.HOST.PID.RAND" in the folder of `final_path`. The
// name is not created; callers create it with O_EXCL / mkdir and retry on
// EEXIST.
std::filesystem::path temp_sibling(const std::filesystem::path& final_path, const std::string& kind);

// Removes the temporaries of `final_path` (both kinds) left by dead processes
// of this host. Returns the paths removed. Never throws.
std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& final_path);

// Interrupt clean-up registry. create_registered_temporary() runs `create`
// (which makes the file or folder p, returning false on failure) under the
// registry's lock and registers p when it succeeded, so that
// remove_registered_temporaries() (recursively) deletes it; no interrupt can
// fall between the two. Returns false without calling `create` when the
// process is being interrupted. Unregister when the temporary was committed
// or removed normally.
bool create_registered_temporary(const std::filesystem::path& p, const std::function<bool()>& create);
void unregister_temporary(const std::filesystem::path& p);
// Removes every registered temporary; returns how many existed. Blocks new
// registrations while it runs and afterwards (the process is ending).
int remove_registered_temporaries();

// Creates and registers a fresh temporary folder temp_sibling(final_path,
// kind) with permissions `mode`, retrying on a name already taken. Returns
// its path, or an empty path with errno set when mkdir fails otherwise;
// qf::Error Io naming final_path ("interrupted") while the process is being
// interrupted. The caller unregisters it when done.
std::filesystem::path create_temporary_folder(const std::filesystem::path& final_path, const std::string& kind,
                                              unsigned mode);

}  // namespace qf

// "did you mean ...?" for misspelled names in recipes, flags and formats.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace qf {

// Optimal string alignment distance (an adjacent transposition counts as one
// edit), case-insensitive.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, within 2 edits and fewer edits than the
// word has characters (case-insensitive); "" when none is that close.
std::string closest_word(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace qf

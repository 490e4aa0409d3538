# Turns a file into a C++ source that defines its bytes, so a static asset (the chat page) is
# part of the binary and the source stays a normal file. A byte array rather than a raw string:
# no delimiter can clash with the content, and no compiler limit on string literals applies.
#
# As a script (cmake -P): -DIN=file -DOUT=generated.cpp -DNAMESPACE=ns -DSYMBOL=name defines
#   extern const unsigned char name[];  (NUL-terminated)   extern const size_t name_size;
# OUT is rewritten only when its text changes, so an unchanged file recompiles nothing.
#
# Included: dsv4_embed_file(OUT IN NAMESPACE SYMBOL) adds the build rule (rerun when IN changes).
if(NOT CMAKE_SCRIPT_MODE_FILE)
  set(DSV4_EMBED_SCRIPT ${CMAKE_CURRENT_LIST_FILE})
  function(dsv4_embed_file out in namespace symbol)
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -DIN=${in} -DOUT=${out} -DNAMESPACE=${namespace} -DSYMBOL=${symbol} -P ${DSV4_EMBED_SCRIPT}
      DEPENDS ${in} ${DSV4_EMBED_SCRIPT}
      COMMENT "Embedding ${in}"
      VERBATIM)
  endfunction()
  return()
endif()

file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
# 32 bytes a line: "0xAB," each, then a line break.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "((0x..,){32})" "\\1\n" bytes "${bytes}")
get_filename_component(name ${IN} NAME)
set(text "// Generated from ${name} by cmake/embed_file.cmake: edit that file, not this one.
#include <cstddef>

namespace ${NAMESPACE} {
extern const unsigned char ${SYMBOL}[] = {
${bytes}
0x00};
extern const size_t ${SYMBOL}_size = ${size};
}  // namespace ${NAMESPACE}
")
file(CONFIGURE OUTPUT ${OUT} CONTENT "${text}" @ONLY)

# Writes the build description that `dsv4 --version` prints (run at every build by the
# dsv4_build_info target, so the commit is the one built). configure_file rewrites OUT only when
# the text changes, so an unchanged tree recompiles nothing.
# Inputs (-D): SOURCE_DIR, TEMPLATE, OUT and the DSV4_* values the template names.
find_package(Git QUIET)
set(DSV4_COMMIT "unknown (not built from a git checkout)")
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} rev-parse --short=12 HEAD
                  OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE commit_rc ERROR_QUIET)
  if(commit_rc EQUAL 0)
    execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SOURCE_DIR} status --porcelain --untracked-files=no
                    OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    set(DSV4_COMMIT "${commit}")
    if(NOT changes STREQUAL "")
      set(DSV4_COMMIT "${commit} with uncommitted changes")
    endif()
  endif()
endif()
configure_file(${TEMPLATE} ${OUT} @ONLY)

# The build description `dsv4 --version` prints, in two modes.
#
# Included (src/CMakeLists.txt): an object library, dsv4_build_info, compiled from the generated
# build_info.cpp, and a target that regenerates the file at every build, so the commit is the
# one built; DSV4_BUILD_INFO_OBJECTS holds its objects for the dsv4 executable.
#
# As a script (cmake -P, from that target): reads the commit and writes OUT from TEMPLATE with
# configure_file, which rewrites OUT only when the text changes, so an unchanged tree recompiles
# and relinks nothing. Inputs (-D): SOURCE_DIR, TEMPLATE, OUT and the DSV4_* values the template
# names.
if(NOT CMAKE_SCRIPT_MODE_FILE)
  set(build_info_cpp ${CMAKE_CURRENT_BINARY_DIR}/build_info.cpp)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" build_type_upper)
  string(STRIP "${CMAKE_CXX_FLAGS} ${CMAKE_CXX_FLAGS_${build_type_upper}}" build_info_flags)
  set(build_info_cuda_compiler "")
  set(build_info_cuda_archs "")
  if(DSV4_HAVE_CUDA)
    set(build_info_cuda_compiler "${CMAKE_CUDA_COMPILER_ID} ${CMAKE_CUDA_COMPILER_VERSION}")
    string(REPLACE ";" ", " build_info_cuda_archs "${DSV4_CUDA_ARCHS}")
  endif()
  add_custom_target(dsv4_build_info_file
    COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${CMAKE_SOURCE_DIR} -DTEMPLATE=${CMAKE_SOURCE_DIR}/src/commands/build_info.cpp.in
            -DOUT=${build_info_cpp} -DDSV4_VERSION=${PROJECT_VERSION} -DDSV4_BUILD_TYPE=${CMAKE_BUILD_TYPE}
            "-DDSV4_COMPILER=${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}" "-DDSV4_CXX_FLAGS=${build_info_flags}"
            "-DDSV4_CUDA_COMPILER=${build_info_cuda_compiler}" "-DDSV4_CUDA_ARCHS=${build_info_cuda_archs}"
            -P ${CMAKE_CURRENT_LIST_FILE}
    BYPRODUCTS ${build_info_cpp}
    COMMENT "Reading the commit for dsv4 --version"
    VERBATIM)
  add_library(dsv4_build_info OBJECT ${build_info_cpp})
  target_include_directories(dsv4_build_info PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  add_dependencies(dsv4_build_info dsv4_build_info_file)
  set(DSV4_BUILD_INFO_OBJECTS $<TARGET_OBJECTS:dsv4_build_info>)
  return()
endif()

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

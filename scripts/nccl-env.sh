# Sourced by the GPU scripts: NVLink multicast off (NCCL_NVLS_ENABLE=0), and DSV4_NCCL_LIBRARY set
# to the first libnccl.so.2 under /usr or /opt (a toolkit's, a Python package's) when neither it
# nor the loader's path names one.
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [ -z "${DSV4_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2 '; then
  nccl_lib=$(find /usr /opt -name 'libnccl.so.2*' -type f 2>/dev/null | head -n 1)
  [ -n "$nccl_lib" ] && export DSV4_NCCL_LIBRARY="$nccl_lib"
  unset nccl_lib
fi

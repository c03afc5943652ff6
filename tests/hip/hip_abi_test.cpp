// hip_abi_test.cpp: the ABI smla declares itself (runtime/hip/hip_api.hpp) matches ROCm's own
// headers, where they are installed. Compiled against /usr/include/hip; never links libamdhip64.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__
#endif
#include <hip/hip_runtime_api.h>
#include <hip/hiprtc.h>

#include "runtime/hip/hip_api.hpp"

namespace smla::hip {
namespace {

TEST(HipAbi, EnumValuesMatchRocmHeaders) {
  EXPECT_EQ(kAttrMaxSharedMemoryPerBlock, static_cast<int>(hipDeviceAttributeMaxSharedMemoryPerBlock));
  EXPECT_EQ(kAttrMultiprocessorCount, static_cast<int>(hipDeviceAttributeMultiprocessorCount));
  EXPECT_EQ(kFuncAttrMaxDynamicSharedMemorySize, static_cast<int>(hipFuncAttributeMaxDynamicSharedMemorySize));
  EXPECT_EQ(kHipSuccess, static_cast<int>(hipSuccess));
  EXPECT_EQ(kHipErrorNoDevice, static_cast<int>(hipErrorNoDevice));
  EXPECT_EQ(kHiprtcSuccess, static_cast<int>(HIPRTC_SUCCESS));
  EXPECT_EQ(kHiprtcErrorCompilation, static_cast<int>(HIPRTC_ERROR_COMPILATION));
  EXPECT_EQ(sizeof(hipError_t), sizeof(smla::hip::hipError_t));
}

TEST(HipAbi, PointerAttributesPrefixMatches) {
  EXPECT_EQ(offsetof(PointerAttributes, device), offsetof(hipPointerAttribute_t, device));
  EXPECT_EQ(offsetof(PointerAttributes, device_pointer), offsetof(hipPointerAttribute_t, devicePointer));
  EXPECT_EQ(offsetof(PointerAttributes, host_pointer), offsetof(hipPointerAttribute_t, hostPointer));
  EXPECT_EQ(offsetof(PointerAttributes, is_managed), offsetof(hipPointerAttribute_t, isManaged));
  EXPECT_EQ(offsetof(PointerAttributes, allocation_flags), offsetof(hipPointerAttribute_t, allocationFlags));
  EXPECT_GE(sizeof(PointerAttributes), sizeof(hipPointerAttribute_t));
}

TEST(HipAbi, ArchNameFoundInARealDevicePropStruct) {
  hipDeviceProp_t prop;
  std::memset(&prop, 0, sizeof prop);
  std::strcpy(prop.name, "AMD Instinct MI250X");
  std::strcpy(prop.gcnArchName, "gfx90a:sramecc+:xnack-");
  prop.gcnArch = 910;
  prop.totalGlobalMem = 0x31786667ull;  // the bytes "gfx1\0...": a decoy the scan must not take
  EXPECT_EQ(find_arch_name(reinterpret_cast<const char*>(&prop), sizeof prop), "gfx90a:sramecc+:xnack-");
  // Without target features the plain processor name is still found.
  prop.totalGlobalMem = 0;
  std::strcpy(prop.gcnArchName, "gfx942");
  EXPECT_EQ(find_arch_name(reinterpret_cast<const char*>(&prop), sizeof prop), "gfx942");
}

}  // namespace
}  // namespace smla::hip

/* c_short_enums.c: smla.h compiled with -fshort-enums (tests/CMakeLists.txt): its enums stay int-sized, so the structs
   the library reads keep the layout it was built with. Compiled only; a failure is a build error. */
#include "smla/smla.h"

_Static_assert(sizeof(smla_status_t) == sizeof(int), "smla_status_t shrank under -fshort-enums");
_Static_assert(sizeof(smla_backend_t) == sizeof(int), "smla_backend_t shrank under -fshort-enums");
_Static_assert(sizeof(smla_dtype_t) == sizeof(int), "smla_dtype_t shrank under -fshort-enums");
_Static_assert(sizeof(smla_config_source_t) == sizeof(int), "smla_config_source_t shrank under -fshort-enums");

int smla_short_enums_checked(void) { return 1; }

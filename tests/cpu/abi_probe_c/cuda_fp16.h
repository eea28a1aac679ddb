
#pragma once
typedef struct { unsigned short x; } __half_raw;
typedef struct { unsigned short x; } __nv_bfloat16;

// The device-clock timeline (bench --timeline, GpuModelOptions::timeline; docs/PERFORMANCE.md §3):
// with TS_TIMELINE=1 every workgroup of every kernel writes when it started and when its last
// invocation finished, read from the device clock (VK_KHR_shader_clock, clockRealtime2x32EXT),
// into its own record: record `linear workgroup id` of the range the recorder binds at binding
// TS_TIMELINE_BINDING for this dispatch (runtime/vulkan/recorder.h, RecorderOptions::timeline).
//
//   record (uvec4):  x = start (the clock's low 32 bits; a step is far shorter than their wrap)
//                    y = the early mark - start + 1, z = the mark - start + 1 (0: no mark)
//                    w = end - start
//
// A kernel may mark two points of its work, TS_MARK_EARLY() and TS_MARK() (e.g. where its inputs
// are loaded, and where a gated consumer's wait ended or a prologue ends): invocation 0's last
// marks are recorded. Without TS_TIMELINE the marks compile to nothing.
// Unlike timestamps between dispatches, nothing is serialized: the step runs as recorded, and the
// host reads each dispatch's first start, last start and last end (runtime/model/timeline.h).
// The kernel's own main() becomes ts_kernel_main() (the define below); this file must be included
// before it (common.glsl includes it; the kernels that do not include common.glsl include it).
// Without TS_TIMELINE this file declares nothing.
#ifndef TESSERA_TIMELINE_GLSL
#define TESSERA_TIMELINE_GLSL
#if defined(TS_TIMELINE)
#if TS_TIMELINE
#extension GL_EXT_shader_realtime_clock : require

layout(std430, binding = TS_TIMELINE_BINDING) writeonly restrict buffer TsTimelineBuf { uvec4 ts_timeline[]; };
uvec2 ts_mark_clock = uvec2(0u), ts_early_clock = uvec2(0u);  // TS_MARK(), TS_MARK_EARLY()
#define TS_MARK() (ts_mark_clock = clockRealtime2x32EXT())
// TS_MARK_GATES (a process-wide define, bench --tune mark_gates=1): the early mark is where a
// gated wait ended (TS_MARK_GATE, gate.glsl), and the kernels' own early marks are dropped.
#if defined(TS_MARK_GATES) && TS_MARK_GATES
#define TS_MARK_EARLY()
#define TS_MARK_GATE() (ts_early_clock = clockRealtime2x32EXT())
#else
#define TS_MARK_EARLY() (ts_early_clock = clockRealtime2x32EXT())
#define TS_MARK_GATE() TS_MARK()
#endif

// b - a of two clock readings, as 32 bits (spans under 4 s).
uint ts_since(uvec2 a, uvec2 b) { return b.x - a.x; }
// A mark as recorded: its offset from start + 1, or 0 where the kernel did not pass it.
uint ts_mark_word(uvec2 start, uvec2 mark) { return mark == uvec2(0u) ? 0u : ts_since(start, mark) + 1u; }

void ts_kernel_main();

void main() {
  const uvec2 start = clockRealtime2x32EXT();
  ts_kernel_main();
  barrier();  // every invocation has returned from the kernel (uniform control flow again)
  if (gl_LocalInvocationIndex == 0u) {
    const uint wg = (gl_WorkGroupID.z * gl_NumWorkGroups.y + gl_WorkGroupID.y) * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    const uvec2 end = clockRealtime2x32EXT();
    if (wg < uint(ts_timeline.length()))
      ts_timeline[wg] = uvec4(start.x, ts_mark_word(start, ts_early_clock), ts_mark_word(start, ts_mark_clock),
                              ts_since(start, end));
  }
}

#define main ts_kernel_main
#endif
#endif
#ifndef TS_MARK
#define TS_MARK()
#define TS_MARK_EARLY()
#define TS_MARK_GATE()
#endif
#endif  // TESSERA_TIMELINE_GLSL

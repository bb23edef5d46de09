/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The stand-in's GPU-error tracepoint: nvidia/nvidia_dev_xid with the real driver's fields in
 * the real driver's order (the PCI name, the Xid number, the message), so linger reads its
 * layout from the format file as it does on a GPU machine.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM nvidia

#if !defined(_STANDIN_XID_H) || defined(TRACE_HEADER_MULTI_READ)
#define _STANDIN_XID_H

#include <linux/tracepoint.h>
#include <linux/version.h>

TRACE_EVENT(nvidia_dev_xid,
	TP_PROTO(const char *dev, u32 error_code, const char *msg),
	TP_ARGS(dev, error_code, msg),
	TP_STRUCT__entry(
		__string(dev, dev)
		__field(u32, error_code)
		__string(msg, msg)
	),
	TP_fast_assign(
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
		__assign_str(dev);
		__assign_str(msg);
#else
		__assign_str(dev, dev);
		__assign_str(msg, msg);
#endif
		__entry->error_code = error_code;
	),
	TP_printk("Xid (PCI:%s): %u, %s", __get_str(dev), __entry->error_code, __get_str(msg))
);

#endif

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#define TRACE_INCLUDE_FILE standin-xid
#include <trace/define_trace.h>

/*
 * Preloaded into the programs of gVisor sandboxes (/etc/ld.so.preload): runsc 20221219
 * (Debian 12's) answers statx(2) and newfstatat(2) with EINVAL when the flags carry
 * AT_NO_AUTOMOUNT, which GNU coreutils passes (`ls -l`, `ls DIR`, `stat`). The flag only
 * keeps an autofs mount from being triggered, and a gVisor sandbox has no automounts, so
 * these wrappers clear it and make the same system call. Nothing else changes.
 *
 * Built without libc (raw system calls; errno through glibc's own __errno_location,
 * resolved when the program loads), x86_64 only, by glovebox-jail's build script.
 */
#define SYS_newfstatat 262
#define SYS_statx 332
#define AT_NO_AUTOMOUNT 0x800

extern int *__errno_location(void);

static long sys5(long n, long a, long b, long c, long d, long e)
{
	long ret;
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
			 : "rcx", "r11", "memory");
	return ret;
}

static int done(long r)
{
	if (r < 0 && r > -4096) {
		*__errno_location() = (int)-r;
		return -1;
	}
	return (int)r;
}

int statx(int fd, const char *path, int flags, unsigned int mask, void *buf)
{
	return done(sys5(SYS_statx, fd, (long)path, flags & ~AT_NO_AUTOMOUNT, mask, (long)buf));
}

int fstatat(int fd, const char *path, void *st, int flags)
{
	return done(sys5(SYS_newfstatat, fd, (long)path, (long)st, flags & ~AT_NO_AUTOMOUNT, 0));
}

int fstatat64(int fd, const char *path, void *st, int flags)
{
	return fstatat(fd, path, st, flags);
}

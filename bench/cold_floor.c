/* The floor of bench/cold_throughput.py (row 6 of `python -m bench`): a minimal, single-threaded
 * libfuse3 low-level server of the same kubelet AtomicWriter layout as the volume fusevol serves,
 * so that the bench shows what any FUSE server reaches for the same requests on this machine.
 * It does no work of its own: every answer is computed from the inode number.
 *
 *     cold_floor <mountpoint> <keys>          (foreground; SIGTERM or SIGINT unmounts and exits)
 *
 * Layout, read-only:  /kNNNNN -> ..data/kNNNNN,  /..data -> VERSION,  /VERSION/kNNNNN = "v" 0644
 * Inodes: 1 = /, 2 = /..data, 3 = /VERSION, SYM0 + i = /kNNNNN, file0 + i = /VERSION/kNNNNN.
 * As fusevol: open answers ENOSYS (the kernel then sends neither open nor release), symlinks are
 * cached in the page cache (FUSE_CAP_CACHE_SYMLINKS), entries and attributes live 300 s.
 */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define VERSION "..2026_11_29_00_00_00.1"
#define SYM0 10
#define TIMEOUT 300.0
#define MAX_KEYS 10000000

static long keys;
static fuse_ino_t file0;

/* The key number of a name "k%05d" below `keys`, or -1. */
static long parse_key(const char *name) {
    if (name[0] != 'k' || name[1] < '0' || name[1] > '9')
        return -1;
    char *end;
    long k = strtol(name + 1, &end, 10);
    if (*end != '\0' || k >= keys)
        return -1;
    char canonical[32];
    snprintf(canonical, sizeof(canonical), "k%05ld", k);
    return strcmp(canonical, name) == 0 ? k : -1;
}

static int fill_attr(fuse_ino_t ino, struct stat *st) {
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    if (ino == 1 || ino == 3) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
    } else if (ino == 2) {
        st->st_mode = S_IFLNK | 0777;
        st->st_nlink = 1;
        st->st_size = strlen(VERSION);
    } else if (ino >= SYM0 && ino < SYM0 + (fuse_ino_t)keys) {
        char target[32];
        st->st_mode = S_IFLNK | 0777;
        st->st_nlink = 1;
        st->st_size = snprintf(target, sizeof(target), "..data/k%05ld", (long)(ino - SYM0));
    } else if (ino >= file0 && ino < file0 + (fuse_ino_t)keys) {
        st->st_mode = S_IFREG | 0644;
        st->st_nlink = 1;
        st->st_size = 1;
    } else {
        return -1;
    }
    return 0;
}

static void reply_entry(fuse_req_t req, fuse_ino_t ino) {
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    e.ino = ino;
    e.generation = 1;
    e.attr_timeout = TIMEOUT;
    e.entry_timeout = TIMEOUT;
    fill_attr(ino, &e.attr);
    fuse_reply_entry(req, &e);
}

static void floor_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
        conn->want |= FUSE_CAP_CACHE_SYMLINKS;
}

static void floor_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    long k;
    if (parent == 1) {
        if (strcmp(name, "..data") == 0) {
            reply_entry(req, 2);
            return;
        }
        if (strcmp(name, VERSION) == 0) {
            reply_entry(req, 3);
            return;
        }
        if ((k = parse_key(name)) >= 0) {
            reply_entry(req, SYM0 + k);
            return;
        }
    } else if (parent == 3 && (k = parse_key(name)) >= 0) {
        reply_entry(req, file0 + k);
        return;
    }
    fuse_reply_err(req, ENOENT);
}

static void floor_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    (void)ino;
    (void)nlookup;
    fuse_reply_none(req);
}

static void floor_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    (void)count;
    (void)forgets;
    fuse_reply_none(req);
}

static void floor_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct stat st;
    if (fill_attr(ino, &st) < 0)
        fuse_reply_err(req, ENOENT);
    else
        fuse_reply_attr(req, &st, TIMEOUT);
}

static void floor_readlink(fuse_req_t req, fuse_ino_t ino) {
    char target[32];
    if (ino == 2) {
        fuse_reply_readlink(req, VERSION);
    } else if (ino >= SYM0 && ino < SYM0 + (fuse_ino_t)keys) {
        snprintf(target, sizeof(target), "..data/k%05ld", (long)(ino - SYM0));
        fuse_reply_readlink(req, target);
    } else {
        fuse_reply_err(req, EINVAL);
    }
}

static void floor_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino;
    (void)fi;
    fuse_reply_err(req, ENOSYS); /* no_open: no open nor release requests from here on */
}

static void floor_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi) {
    (void)fi;
    if (ino < file0 || ino >= file0 + (fuse_ino_t)keys)
        fuse_reply_err(req, EISDIR);
    else if (off >= 1 || size == 0)
        fuse_reply_buf(req, NULL, 0);
    else
        fuse_reply_buf(req, "v", 1);
}

static const struct fuse_lowlevel_ops ops = {
    .init = floor_init,
    .lookup = floor_lookup,
    .forget = floor_forget,
    .forget_multi = floor_forget_multi,
    .getattr = floor_getattr,
    .readlink = floor_readlink,
    .open = floor_open,
    .read = floor_read,
};

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s <mountpoint> <keys>\n", argv[0]);
        return 2;
    }
    char *end;
    keys = strtol(argv[2], &end, 10);
    if (*argv[2] == '\0' || *end != '\0' || keys < 1 || keys > MAX_KEYS) {
        fprintf(stderr, "%s: keys must be 1..%d\n", argv[0], MAX_KEYS);
        return 2;
    }
    file0 = SYM0 + keys;

    char *fuse_argv[] = {argv[0], "-o", "allow_other,default_permissions,fsname=cold-floor", NULL};
    struct fuse_args args = FUSE_ARGS_INIT(3, fuse_argv);
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof(ops), NULL);
    int ret = 1;
    if (se == NULL)
        goto out;
    if (fuse_set_signal_handlers(se) != 0)
        goto destroy;
    if (fuse_session_mount(se, argv[1]) != 0)
        goto signals;
    /* 0, -errno, or the number of the signal that ended the loop: a clean stop */
    ret = fuse_session_loop(se) < 0 ? 1 : 0;
    fuse_session_unmount(se);
signals:
    fuse_remove_signal_handlers(se);
destroy:
    fuse_session_destroy(se);
out:
    fuse_opt_free_args(&args);
    return ret;
}

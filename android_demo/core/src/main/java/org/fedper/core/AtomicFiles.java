package org.fedper.core;

import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;

/**
 * Crash-safe writes: a temporary file beside the target, fsynced, renamed over it, then the
 * directory fsynced (a rename is an entry of the directory: until the directory reaches the disk, a
 * power cut can bring back the old file, or none).
 */
public final class AtomicFiles {
  private AtomicFiles() {}

  public static void write(Path target, byte[] data) throws IOException {
    Path dir = target.toAbsolutePath().getParent();
    Files.createDirectories(dir);
    Path tmp = Files.createTempFile(dir, "." + target.getFileName(), ".partial");
    try {
      try (FileOutputStream out = new FileOutputStream(tmp.toFile())) {
        out.write(data);
        out.getFD().sync();
      }
      replace(tmp, target);
    } finally {
      Files.deleteIfExists(tmp);
    }
  }

  /** Flushes a directory's entries (Linux, so Android: a directory opens for reading and syncs). */
  public static void syncDirectory(Path dir) throws IOException {
    try (FileChannel channel = FileChannel.open(dir, StandardOpenOption.READ)) {
      channel.force(true);
    }
  }

  /** Renames source over target, atomically where the file system can, and syncs the directory. */
  public static void replace(Path source, Path target) throws IOException {
    try {
      Files.move(source, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } catch (AtomicMoveNotSupportedException ex) {
      Files.move(source, target, StandardCopyOption.REPLACE_EXISTING);
    }
    syncDirectory(target.toAbsolutePath().getParent());
  }
}

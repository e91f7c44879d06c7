package org.fedper.core;

import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/** Crash-safe writes: a temporary file beside the target, fsynced, then renamed over it. */
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

  /** Renames source over target, atomically where the file system can. */
  public static void replace(Path source, Path target) throws IOException {
    try {
      Files.move(source, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
    } catch (AtomicMoveNotSupportedException ex) {
      Files.move(source, target, StandardCopyOption.REPLACE_EXISTING);
    }
  }
}

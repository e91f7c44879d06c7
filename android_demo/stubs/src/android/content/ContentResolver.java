// API stub (signatures only) of android.content.ContentResolver.
// Mirrors frameworks/base/core/java/android/content/ContentResolver.java (API 34 (compileSdk 34)).
// Checked against: https://developer.android.com/reference/android/content/ContentResolver (API 34); AOSP frameworks/base core/java/android/content/ContentResolver.java excerpt (public final @Nullable InputStream openInputStream(@NonNull Uri) throws FileNotFoundException); AOSP android-14 source itself not fetched (frameworks/base too large to mirror).
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package android.content;

import android.net.Uri;
import java.io.FileNotFoundException;
import java.io.InputStream;

public abstract class ContentResolver {
  public ContentResolver(Context context) {
    throw new UnsupportedOperationException("stub");
  }

  public final InputStream openInputStream(Uri uri) throws FileNotFoundException {
    throw new UnsupportedOperationException("stub");
  }
}

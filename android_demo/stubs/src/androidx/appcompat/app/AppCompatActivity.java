// API stub (signatures only) of androidx.appcompat.app.AppCompatActivity.
// Mirrors androidx/appcompat/appcompat/src/main/java/androidx/appcompat/app/AppCompatActivity.java (androidx.appcompat:appcompat 1.7.0).
// Checked against: androidx/androidx:appcompat/appcompat/src/main/java/androidx/appcompat/app/AppCompatActivity.java (@2fe0f867 in the index; findViewById/setContentView/onCreate overrides also seen in decompiled appcompat; the protected onDestroy override read at androidx/androidx@0850be80d556fc23a6f39a094c923665c24e3de2)
// Only the members android_demo/app uses; bodies throw. Not shipped: the real library is on the device.
package androidx.appcompat.app;

import android.os.Bundle;
import android.view.View;

public class AppCompatActivity extends androidx.fragment.app.FragmentActivity {
  public AppCompatActivity() {
    throw new UnsupportedOperationException("stub");
  }

  @Override protected void onCreate(Bundle savedInstanceState) {
    throw new UnsupportedOperationException("stub");
  }

  @Override protected void onDestroy() {
    throw new UnsupportedOperationException("stub");
  }

  @Override public void setContentView(int layoutResID) {
    throw new UnsupportedOperationException("stub");
  }

  @Override public <T extends View> T findViewById(int id) {
    throw new UnsupportedOperationException("stub");
  }
}
